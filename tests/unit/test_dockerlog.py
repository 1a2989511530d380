"""The Docker log stream's framing, pure, on real bytes: bodies of `GET /containers/{id}/logs?stdout=1&stderr=1
&timestamps=1` as dockerd 20.10.24 wrote them (tests/corpus/docker, SOURCES.md says how they were made)."""

import pytest

from gpuwarden.engine.dockerlog import Frames, Lines, stamp
from gpuwarden.engine.logs import LogReader


def read(corpus, name: str) -> bytes:
    return (corpus / "docker" / name).read_bytes()


def multiplexed(data: bytes, piece: int | None = None) -> list[str]:
    """Lines from a multiplexed stream fed in pieces of `piece` bytes (as a socket may cut it)."""
    frames, lines, out = Frames(), Lines(), []
    for at in range(0, len(data), piece or len(data)):
        for stream, payload in frames.feed(data[at:at + (piece or len(data))]):
            out += lines.messages(stream, [payload])
    return out


def test_llamacpp_through_the_multiplexed_stream_whole_or_cut_anywhere(corpus):
    data = read(corpus, "llamacpp-multiplexed.bin")
    whole = multiplexed(data)
    assert whole[0] == "0.00.010.623 I srv  llama_server: initializing ..."  # the time in front is taken off
    assert sum("processing task" in line for line in whole) == 2 == sum("stop processing" in line for line in whole)
    for piece in (1, 7, 8, 9, 4096):
        assert multiplexed(data, piece) == whole
    reader = LogReader("llamacpp")
    for line in whole:
        reader.feed(line)
    assert reader.sample().progress == 4 and reader.sample().running == 0  # two requests, each begun and ended


def test_both_streams_are_framed_with_their_number(corpus):
    frames = Frames().feed(read(corpus, "long-line-multiplexed.bin"))
    assert [kind for kind, _ in frames[:2]] == [1, 2]  # stdout, stderr
    assert frames[0][1].endswith(b" short out\n") and frames[1][1].endswith(b" short err\n")


def test_a_line_over_dockers_16k_messages_is_joined_whatever_the_cut(corpus):
    data = read(corpus, "long-line-multiplexed.bin")
    sizes = [len(payload) for _, payload in Frames().feed(data)]
    assert sizes[2] == 16384 + 31  # a partial message: 16 KiB and its own timestamp
    for piece in (None, 1000, 16415):
        assert multiplexed(data, piece) == ["short out", "short err", "long " + "x" * 32768 + " end", "after"]


def test_a_tty_stream_is_raw_lines_ending_in_crlf(corpus):
    data = read(corpus, "llamacpp-tty.bin")
    lines = Lines()
    out = lines.raw(data[:1000]) + lines.raw(data[1000:])
    assert out == Lines().raw(data) and not any(line.endswith("\r") for line in out)
    assert sum("processing task" in line for line in out) == 2  # colour codes in front do not hide it
    reader = LogReader("llamacpp")
    for line in out:
        reader.feed(line)
    assert reader.sample().progress == 4


def test_a_resumed_stream_drops_what_was_already_taken(corpus):
    data = read(corpus, "llamacpp-multiplexed.bin")
    whole, lines = multiplexed(data), Lines()
    for stream, payload in Frames().feed(data)[:10]:
        lines.messages(stream, [payload])
    # `since` is inclusive: the resumed connection sends the last message taken again, and everything after
    lines.resume()
    rest = [p for _, p in Frames().feed(data)][9:]
    assert whole[:10] + [line for p in rest for line in lines.messages(1, [p])] == whole


def test_stamps_and_what_is_not_a_multiplexed_stream():
    assert stamp(b"2026-12-03T15:43:37.544893147Z hello\n") == ((1796312617, 544893147), b"hello\n")
    assert stamp(b"no time here\n") == (None, b"no time here\n")
    with pytest.raises(ValueError, match="not a Docker multiplexed log stream"):
        Frames().feed(b"2026-12-03T15:43:37.544893147Z raw tty bytes\n")
    frames = Frames()
    assert frames.feed(b"\x01\0\0\0\0\0\0\x05he") == [] and frames.feed(b"llo") == [(1, b"hello")]
