"""The registry of engine kinds is the one list: what each kind offers, and what `check` takes from it."""

import dataclasses

import pytest

from gpuwarden import enginekinds
from gpuwarden.config.settings import ConfigError, parse

ENGINE = '[[engine]]\nname = "e"\nurl = "http://127.0.0.1:8000"\n'


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, "gw.toml")
    return str(info.value)


def test_the_five_kinds_each_offer_a_source_a_canary_and_a_way_to_be_found():
    assert enginekinds.names() == ("vllm", "sglang", "llamacpp", "tgi", "ollama")
    for kind in enginekinds.all_kinds():
        assert kind.sources and kind.canary.name and kind.commands and kind.executables and kind.more, kind.name
    assert set(enginekinds.canary_apis()) == {"openai", "sglang", "llamacpp", "ollama"}


def test_a_kind_is_registered_once_and_never_under_a_word_config_keeps():
    vllm = enginekinds.named("vllm")
    for name in ("vllm", "auto", "off"):
        with pytest.raises(ValueError):
            enginekinds.register(dataclasses.replace(vllm, name=name))
    assert enginekinds.names().count("vllm") == 1


@pytest.mark.parametrize(("settings", "why"), [
    ('profile = "ollama"\n', 'Ollama offers no source \'metrics\': use source = "log"'),  # it broke `run` before
    ('profile = "tgi"\nsource = "log"\nlog_unit = "tgi.service"\n', "TGI offers no source 'log'"),
    ('profile = "vllm"\nsource = "slots"\n', 'vLLM offers no source \'slots\': use source = "metrics" or source = '
                                             '"log"'),
    ('profile = "mlc"\n', "unknown engine kind 'mlc': one of auto, vllm, sglang, llamacpp, tgi, ollama"),
    ('canary = "vllm"\n', "unknown canary API 'vllm': one of auto, openai, sglang, llamacpp, ollama, off"),
])
def test_check_takes_only_what_a_registered_kind_offers(settings, why):
    assert why in error_of(ENGINE + settings)


def test_check_takes_each_source_a_kind_offers():
    for kind in enginekinds.all_kinds():
        for source in kind.sources:
            log = 'log_unit = "x.service"\n' if source == "log" else ""
            parse(f'{ENGINE}profile = "{kind.name}"\nsource = "{source}"\n{log}canary = "{kind.canary.name}"\n')
