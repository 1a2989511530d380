"""Write a small random-weight Llama model as GGUF for llama-server, with no model hub and no tokenizer file.

    python gguf_model.py OUT.gguf [--hidden 128 --layers 2 --heads 4 --ff 256 --vocab 1024 --ctx 2048]

Run with a Python that has `gguf` and `numpy` (tests/peers/install.sh makes one). The vocabulary is a made-up
SentencePiece ("llama") one: three control tokens, the 256 byte-fallback tokens the tokenizer needs, then
numbered pieces. Prompts are lists of token ids; what comes out is random tokens.
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    kinds = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [kinds.UNKNOWN, kinds.CONTROL, kinds.CONTROL] + [kinds.BYTE] * 256
    tokens += ["\u2581"] + [f"\u2581w{i}" for i in range(size - len(tokens) - 1)]
    types += [kinds.NORMAL] * (size - len(types))
    return tokens, [-float(i) for i in range(size)], types


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("out")
    for name, default in (("hidden", 128), ("layers", 2), ("heads", 4), ("ff", 256), ("vocab", 1024), ("ctx", 2048)):
        args.add_argument(f"--{name}", type=int, default=default)
    a = args.parse_args()
    head_dim = a.hidden // a.heads
    writer = gguf.GGUFWriter(a.out, "llama")
    writer.add_name("gpuwarden-test-llama")
    writer.add_context_length(a.ctx)
    writer.add_embedding_length(a.hidden)
    writer.add_block_count(a.layers)
    writer.add_feed_forward_length(a.ff)
    writer.add_head_count(a.heads)
    writer.add_head_count_kv(a.heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(a.vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = vocabulary(a.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    rng = np.random.default_rng(7)

    def weights(rows: int, cols: int, scale: float = 0.02) -> np.ndarray:  # (out, in), as GGUF stores them
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    norm = lambda: np.ones(a.hidden, dtype=np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", weights(a.vocab, a.hidden, 1.0))
    for i in range(a.layers):
        block = f"blk.{i}."
        for name, shape in (("attn_q", (a.hidden, a.hidden)), ("attn_k", (a.hidden, a.hidden)),
                            ("attn_v", (a.hidden, a.hidden)), ("attn_output", (a.hidden, a.hidden)),
                            ("ffn_gate", (a.ff, a.hidden)), ("ffn_up", (a.ff, a.hidden)),
                            ("ffn_down", (a.hidden, a.ff))):
            writer.add_tensor(f"{block}{name}.weight", weights(*shape))
        writer.add_tensor(f"{block}attn_norm.weight", norm())
        writer.add_tensor(f"{block}ffn_norm.weight", norm())
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", weights(a.vocab, a.hidden, 0.5))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
