"""Server command lines against the commands the model cards and the z-lab README publish.

The expected commands below are copied from the card text quoted in shared/reference/dflash.md §5 and
servers.md §5, not produced by the code. Flag order does not matter to the servers, so commands are
compared as (positional arguments, {flag: value}); JSON values are compared parsed.
"""

from __future__ import annotations

import json
import shlex

import pytest

from dflash_bench import models, profiles
from dflash_bench.errors import UserError


def parse(argv: list[str] | str) -> tuple[list[str], dict[str, object]]:
    """(positionals, {flag: value or True}); a JSON value is parsed so spacing does not matter."""
    argv = shlex.split(argv) if isinstance(argv, str) else list(argv)
    pos, flags, i = [], {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or nxt.startswith("--"):
                flags[arg], i = True, i + 1
                continue
            flags[arg] = json.loads(nxt) if nxt.startswith("{") else nxt
            i += 2
        else:
            pos.append(arg)
            i += 1
    return pos, flags


def without_spec(card: str) -> str:
    """The AR baseline of a card command: the same command minus --speculative-config / --speculative-*."""
    pos, flags = parse(card)
    kept = [f"{k} {shlex.quote(v) if not isinstance(v, (bool, dict)) else ''}".strip()
            for k, v in flags.items() if not k.startswith("--speculative")]
    return " ".join(pos + kept)


VLLM_CARDS = {
    # z-lab README, "vLLM" quick start (Qwen3.5-27B).
    "Qwen3.5-27B": """vllm serve Qwen/Qwen3.5-27B
      --speculative-config '{"method": "dflash", "model": "z-lab/Qwen3.5-27B-DFlash", "num_speculative_tokens": 15}'
      --attention-backend flash_attn --max-num-batched-tokens 32768""",
    # Same card form for the Qwen3 b16 drafters.
    "Qwen3-8B": """vllm serve Qwen/Qwen3-8B
      --speculative-config '{"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 15}'
      --attention-backend flash_attn --max-num-batched-tokens 32768""",
    # LLaMA-3.1 card: block 10, so num_speculative_tokens 9.
    "Llama-3.1-8B-Instruct": """vllm serve meta-llama/Llama-3.1-8B-Instruct
      --speculative-config '{"method": "dflash", "model": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", "num_speculative_tokens": 9}'
      --attention-backend flash_attn --max-num-batched-tokens 32768""",
    # gemma-4-31B-it-DFlash card.
    "gemma-4-31B-it": """vllm serve google/gemma-4-31B-it
      --speculative-config '{"method":"dflash","model":"z-lab/gemma-4-31B-it-DFlash","num_speculative_tokens":15,"attention_backend":"flash_attn"}'
      --attention-backend triton_attn --max-num-batched-tokens 32768 --trust-remote-code""",
}

SGLANG_CARDS = {
    # Older Qwen3-8B card; --speculative-num-draft-tokens 16 is the drafter's block size.
    "Qwen3-8B": """python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm DFLASH
      --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 --speculative-num-draft-tokens 16 --tp-size 1
      --dtype bfloat16 --attention-backend fa3 --mem-fraction-static 0.75 --trust-remote-code""",
    # First z-lab README (SGLang PR #16818 era).
    "Qwen3-Coder-30B-A3B": """python3 -m sglang.launch_server --model-path Qwen/Qwen3-Coder-30B-A3B-Instruct
      --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3-Coder-30B-A3B-DFlash
      --speculative-num-draft-tokens 16 --tp-size 1 --dtype bfloat16 --attention-backend fa3
      --mem-fraction-static 0.75 --trust-remote-code""",
    # Current z-lab README, "SGLang" quick start.
    "Qwen3.5-35B-A3B": """python3 -m sglang.launch_server --model-path Qwen/Qwen3.5-35B-A3B
      --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/Qwen3.5-35B-A3B-DFlash
      --speculative-num-draft-tokens 16 --tp-size 1 --attention-backend trtllm_mha
      --speculative-draft-attention-backend fa4 --mem-fraction-static 0.75
      --mamba-scheduler-strategy extra_buffer --trust-remote-code""",
    # Gemma-4 card (PR #23000 build).
    "gemma-4-31B-it": """python3 -m sglang.launch_server --model-path google/gemma-4-31B-it --attention-backend triton
      --speculative-algorithm DFLASH --speculative-draft-model-path z-lab/gemma-4-31B-it-DFlash
      --speculative-draft-attention-backend fa4 --speculative-num-draft-tokens 16""",
}


@pytest.mark.parametrize("name", sorted(VLLM_CARDS))
def test_vllm_commands_match_the_cards(name):
    card = VLLM_CARDS[name] + " --port 8000"
    pair = models.resolve(name)
    vllm = profiles.get("vllm")
    assert parse(vllm.command(pair, "dflash", 8000)) == parse(card)
    assert parse(vllm.command(pair, "ar", 8000)) == parse(without_spec(card))


@pytest.mark.parametrize("name", sorted(SGLANG_CARDS))
def test_sglang_commands_match_the_cards(name):
    card = SGLANG_CARDS[name] + " --port 30000 --enable-metrics"
    pair = models.resolve(name)
    sglang = profiles.get("sglang")
    assert parse(sglang.command(pair, "dflash", 30000)) == parse(card)
    assert parse(sglang.command(pair, "ar", 30000)) == parse(without_spec(card))


def test_card_environment_variables():
    # Qwen3.5 SGLang card: export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1. Gemma vLLM: V2 model runner.
    assert profiles.get("sglang").env(models.resolve("Qwen3.5-35B-A3B"), "dflash") == {
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    gemma = models.resolve("gemma-4-31B-it")
    assert profiles.get("vllm").env(gemma, "ar") == profiles.get("vllm").env(gemma, "dflash") == {
        "VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_only_a_sweeps_vllm_gets_the_dev_mode_that_serves_its_cache_reset():
    """A sweep empties a vLLM server's prefix cache before each cell through a route vLLM serves only with
    VLLM_SERVER_DEV_MODE=1: the sweep's servers get it beside the card's variables; `dflash-bench launch`'s do not."""
    from dflash_bench.launch import plan_server

    *_, swept, _ = plan_server("vllm", "gemma-4-31B-it", "dflash", runner="process", cache_reset=True)
    *_, launched, _ = plan_server("vllm", "gemma-4-31B-it", "dflash", runner="process")
    assert swept == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert launched == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    *_, sglang, _ = plan_server("sglang", "Qwen3-8B", "ar", runner="process", cache_reset=True)
    assert sglang == {}  # its /flush_cache needs nothing


def test_a_mixture_of_random_weights_draws_its_experts_at_random():
    """Random weights send every token of a mixture to the same few experts: vLLM's and SGLang's servers of a
    mixture's random weights get the engine's switch that draws experts at random, for AR and DFlash alike; real
    weights, a dense target and an engine with no switch do not."""
    from dflash_bench.launch import plan_server

    ROUTING_SIMULATION_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"

    def env(engine, pair, mode, args):
        return plan_server(engine, pair, mode, runner="process", extra_args=args)[3]

    for mode in ("ar", "dflash"):
        assert env("vllm", "gpt-oss-120b", mode, ["--load-format=dummy"]) == {ROUTING_SIMULATION_ENV: "uniform_random"}
    moe = env("vllm", "gemma-4-26B-A4B-it", "dflash", ["--load-format", "dummy"])
    assert moe == {"VLLM_USE_V2_MODEL_RUNNER": "1", ROUTING_SIMULATION_ENV: "uniform_random"}  # beside the card's
    assert env("vllm", "gpt-oss-120b", "ar", ["--load-format=dummy", "--load-format=auto"]) == {}  # the last one wins
    assert env("vllm", "gpt-oss-120b", "ar", []) == {}
    assert env("vllm", "gemma-4-31B-it", "ar", ["--load-format=dummy"]) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert env("sglang", "gpt-oss-120b", "ar", ["--load-format=dummy"]) == {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}
    assert env("sglang", "gpt-oss-120b", "ar", []) == {}
    assert profiles.get("builtin").random_weights_env(models.resolve("gpt-oss-120b")) == {}
    assert profiles.get("sglang").routes_at_random(["SGLANG_SIMULATE_UNIFORM_EXPERTS"])
    assert not profiles.get("vllm").routes_at_random(["SGLANG_SIMULATE_UNIFORM_EXPERTS", "VLLM_SERVER_DEV_MODE"])


def test_the_builtin_engine_serves_its_cache_reset_as_it_is_launched(tmp_path):
    """The builtin server always serves vLLM's POST /reset_prefix_cache: a sweep empties its prefix cache before
    each cell through that route, and its servers are launched as `dflash-bench launch`'s are, with nothing added."""
    from dflash_bench.launch import plan_server

    assert profiles.get("builtin").cache_reset == "/reset_prefix_cache"
    (target := tmp_path / "target").mkdir()
    swept = plan_server("builtin", str(target), "ar", runner="process", cache_reset=True)
    launched = plan_server("builtin", str(target), "ar", runner="process")
    assert swept[2:4] == launched[2:4]  # the same command and environment


def test_only_a_sweeps_llamacpp_gets_the_flags_that_let_its_slots_be_emptied(tmp_path):
    """llama.cpp refuses POST /slots without --slot-save-path, and erasing a slot leaves its host-memory cache: a
    sweep's server gets both flags, before the user's --engine-arg (which wins, llama.cpp taking a flag's last
    value); `dflash-bench launch`'s gets neither."""
    from dflash_bench.launch import plan_server

    model = str(tmp_path / "m.gguf")
    _, _, swept, _, _ = plan_server("llamacpp", model, "ar", runner="process", cache_reset=True,
                                    extra_args=["--cache-ram", "512"])
    _, _, launched, _, _ = plan_server("llamacpp", model, "ar", runner="process", extra_args=["--cache-ram", "512"])
    assert swept[-6:] == ["--cache-ram", "0", "--slot-save-path", "/tmp", "--cache-ram", "512"]
    assert "--slot-save-path" not in launched and launched.count("--cache-ram") == 1


def test_a_users_engine_arg_that_keeps_llamacpps_host_cache_is_named_as_what_emptying_leaves(tmp_path):
    """The flag's last value is the one llama.cpp takes: given another value than the sweep's (either spelling),
    the cells cannot say their cache was emptied; the sweep's own value, another flag, or an engine that keeps
    nothing of the kind leave nothing to say."""
    from dflash_bench.launch import plan_server

    llamacpp, model = profiles.get("llamacpp"), str(tmp_path / "m.gguf")
    for extra, given in ((["--cache-ram", "512"], "512"), (["--cache-ram=-1"], "-1"), ([], None),
                         (["--cache-ram", "512", "--cache-ram", "0"], None), (["--slot-save-path", "/x"], None)):
        _, _, argv, _, _ = plan_server("llamacpp", model, "ar", runner="process", cache_reset=True, extra_args=extra)
        left = llamacpp.cache_left(argv)
        if given is None:
            assert left is None, extra
        else:
            assert left is not None and left.startswith(f"the server runs with --cache-ram {given} (an --engine-arg "
                                                        "over the sweep's 0): the prompts its slots held stay"), left
    assert profiles.get("vllm").cache_left(["vllm", "serve", "m", "--cache-ram", "512"]) is None


def test_sglang_presets_swap_generation_specific_backends():
    sglang = profiles.get("sglang")
    # Hopper has no trtllm_mha / fa4 kernels: the Qwen3.5 card runs on fa3 there.
    _, h100 = parse(sglang.command(models.resolve("Qwen3.5-35B-A3B"), "dflash", 30000, preset="h100"))
    assert h100["--attention-backend"] == "fa3" and h100["--speculative-draft-attention-backend"] == "fa3"
    # Blackwell has no fa3: the Qwen3-8B card's fa3 becomes trtllm_mha.
    _, b300 = parse(sglang.command(models.resolve("Qwen3-8B"), "ar", 30000, preset="b300"))
    assert b300["--attention-backend"] == "trtllm_mha"
    # GPU names map onto their generation's preset.
    assert sglang.command(models.resolve("Qwen3-8B"), "ar", 1, preset="H200") == sglang.command(
        models.resolve("Qwen3-8B"), "ar", 1, preset="h100")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "builtin"])
@pytest.mark.parametrize("preset", ["generic", "h100", "b300"])
def test_ar_and_dflash_differ_only_in_speculative_flags(engine, preset):
    profile = profiles.get(engine)
    spec_flags = {"--speculative-config", "--speculative-algorithm", "--speculative-draft-model-path",
                  "--speculative-num-draft-tokens", "--speculative-draft-attention-backend", "--mode", "--draft"}
    for pair in models.known():
        ar_pos, ar = parse(profile.command(pair, "ar", 9000, preset, ["--seed", "0"]))
        df_pos, df = parse(profile.command(pair, "dflash", 9000, preset, ["--seed", "0"]))
        assert ar_pos == df_pos
        assert {k: v for k, v in df.items() if k not in spec_flags} == {
            k: v for k, v in ar.items() if k not in spec_flags}
        assert ar["--seed"] == "0" and ar["--port"] == "9000"
        assert not any(k.startswith("--speculative") for k in ar)
        if engine == "vllm":
            assert df["--speculative-config"]["num_speculative_tokens"] == pair.block_size - 1
        if engine == "sglang":
            assert df["--speculative-num-draft-tokens"] == str(pair.block_size)


def test_builtin_command_follows_the_serve_contract():
    # dflash-bench serve --model TARGET --draft DRAFTER --mode ar|dflash --port P [--dtype] [--device]
    pair = models.resolve("Qwen3-8B")
    builtin = profiles.get("builtin")
    assert parse(builtin.command(pair, "dflash", 8123)) == parse(
        "dflash-bench serve --model Qwen/Qwen3-8B --draft z-lab/Qwen3-8B-DFlash-b16 --mode dflash --port 8123")
    assert parse(builtin.command(pair, "ar", 8123, preset="h100")) == parse(
        "dflash-bench serve --model Qwen/Qwen3-8B --mode ar --port 8123 --device cuda --dtype bfloat16")
    assert builtin.ready_path == "/health" and builtin.acceptance == "builtin-metrics"
    # docker/Dockerfile's ENTRYPOINT is `dflash-bench serve --host 0.0.0.0`: the container gets the rest.
    assert builtin.container_command(builtin.command(pair, "ar", 8123))[:2] == ["--model", "Qwen/Qwen3-8B"]


def test_profiles_say_readiness_acceptance_and_image():
    vllm, sglang = profiles.get("vllm"), profiles.get("sglang")
    assert (vllm.ready_path, vllm.acceptance) == ("/health", "vllm-metrics")
    assert (sglang.ready_path, sglang.acceptance) == ("/health", "sglang-meta")
    assert vllm.image.startswith("vllm/vllm-openai:v") and sglang.image.startswith("lmsysorg/sglang:v")
    # vllm/vllm-openai's entrypoint is `vllm serve`: the container command starts at the model.
    argv = vllm.command(models.resolve("Qwen3-8B"), "ar", 8000)
    assert vllm.container_command(argv)[0] == "Qwen/Qwen3-8B"
    argv = sglang.command(models.resolve("Qwen3-8B"), "ar", 30000)
    assert sglang.container_command(argv)[:3] == ["python3", "-m", "sglang.launch_server"]


def test_bad_engine_mode_preset_are_one_sentence_errors():
    with pytest.raises(UserError, match="unknown engine 'tgi'.*vllm, sglang, builtin"):
        profiles.get("tgi")
    pair = models.resolve("Qwen3-8B")
    with pytest.raises(UserError, match="unknown mode"):
        profiles.get("vllm").command(pair, "eagle", 8000)
    with pytest.raises(UserError, match="unknown GPU preset 'a100'"):
        profiles.get("vllm").command(pair, "ar", 8000, preset="a100")
    no_drafter = models.resolve("someorg/some-model")
    assert profiles.get("vllm").command(no_drafter, "ar", 8000)[2] == "someorg/some-model"
    with pytest.raises(UserError, match="no DFlash drafter"):
        profiles.get("vllm").command(no_drafter, "dflash", 8000)


def test_each_profile_declares_how_it_is_measured():
    from dflash_bench.client.protocol import APIS
    from dflash_bench.launch import RUNNERS
    from dflash_bench.metrics.acceptance import READERS

    assert profiles.names() == list(profiles.PROFILES)
    for p in profiles.PROFILES.values():
        assert p.acceptance in READERS and p.api in APIS and p.runner in RUNNERS, p.name
        assert p.chat_template in ("server", "client"), p.name
        # a server that takes templated text is sent the target's tokenizer; a chat server is sent none
        pair = models.resolve("Qwen3-8B")
        assert p.tokenizer(pair) == (pair.target if p.chat_template == "client" else None)
    assert profiles.get("sglang").api == "generate" and profiles.get("sglang").chat_template == "client"
    assert [n for n, p in profiles.PROFILES.items() if p.runner == "process"] == ["builtin", "emulator", "llamacpp"]


def test_cell_acceptance_reads_the_profiles_source():
    """The same /metrics delta gives tau to the engine whose counters it holds, and nothing to the others."""
    from dflash_bench.metrics.acceptance import cell_acceptance

    delta = {"llamacpp:spec_decode_num_drafts_total": 10.0, "llamacpp:spec_decode_num_draft_tokens_total": 150.0,
             "llamacpp:spec_decode_num_accepted_tokens_total": 25.0,
             'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 8.0}
    got = cell_acceptance("llamacpp", delta, [])
    assert got["acceptance_source"] == "llamacpp-metrics" and got["acceptance_length"] == pytest.approx(3.5)
    assert got["acceptance_rate"] == pytest.approx(25 / 150) and got["acceptance_per_position"] == [0.8]
    assert cell_acceptance("vllm", delta, []) == {} and cell_acceptance("builtin", delta, []) == {}
    vllm_delta = {k.replace("llamacpp:", "vllm:"): v for k, v in delta.items()}
    assert cell_acceptance("builtin", vllm_delta, [])["acceptance_source"] == "builtin-metrics"
    assert cell_acceptance("emulator", vllm_delta, [])["acceptance_source"] == "vllm-metrics"
    assert cell_acceptance("llamacpp", vllm_delta, []) == {}


@pytest.mark.parametrize("preset", ["generic", "h100"])
def test_llamacpp_command_follows_docs_speculative(preset):
    # docs/speculative.md: llama-server -m T.gguf -md D.gguf --spec-type draft-dflash --spec-draft-n-max 15
    llama = profiles.get("llamacpp")
    pair = models.resolve("Qwen3-8B")
    gguf = type(pair)(**{**pair.__dict__, "target": "/c/t.gguf", "drafter": "/c/d.gguf"})
    ar, df = llama.command(gguf, "ar", 8080, preset), llama.command(gguf, "dflash", 8080, preset)
    assert df[:3] == ["llama-server", "-m", "/c/t.gguf"]
    spec = df[df.index("-md"):df.index("-md") + 6]
    assert spec == ["-md", "/c/d.gguf", "--spec-type", "draft-dflash", "--spec-draft-n-max", "15"]
    assert [a for a in df if a not in spec] == ar  # AR is the DFlash command minus the draft flags
    assert {"--metrics", "--jinja"} <= set(ar) and ar[ar.index("--port") + 1] == "8080"
    assert ("-ngl" in ar) == (preset != "generic")
    assert llama.container_command(ar)[:2] == ["-m", "/c/t.gguf"]  # the image's entrypoint is llama-server
    assert llama.image_for(preset) == ("ghcr.io/ggml-org/llama.cpp:server" if preset == "generic"
                                       else "ghcr.io/ggml-org/llama.cpp:server-cuda")
    assert (llama.acceptance, llama.api, llama.chat_template, llama.runner) == (
        "llamacpp-metrics", "chat", "server", "process")


def test_the_builtin_sweep_gives_synthetic_acceptance_to_its_dflash_server_only():
    builtin = profiles.get("builtin")
    pair = models.resolve("Qwen3-8B")
    extra = ["--fast", "--synthetic-acceptance=6.5", "--benchmark-only", "--load-format=dummy"]
    ar = builtin.command(pair, "ar", 8000, extra_args=extra)
    dflash = builtin.command(pair, "dflash", 8000, extra_args=extra)
    assert ar[-2:] == ["--fast", "--load-format=dummy"] and "--benchmark-only" not in ar
    assert dflash[-4:] == extra
    split = builtin.command(pair, "ar", 8000, extra_args=["--synthetic-acceptance", "6.5", "--fast"])
    assert split[-1] == "--fast" and "6.5" not in split  # the value goes with its flag
    assert profiles.get("vllm").command(pair, "ar", 8000, extra_args=["--benchmark-only"])[-1] == "--benchmark-only"


def test_an_eagle3_server_is_the_ar_command_plus_vllms_eagle3_config():
    vllm, pair = profiles.get("vllm"), models.resolve("Qwen3-8B")
    ar_pos, ar = parse(vllm.command(pair, "ar", 8000, "h100", ["--seed", "0"]))
    e3_pos, e3 = parse(vllm.command(pair, "eagle3", 8000, "h100", ["--seed", "0"]))
    assert e3_pos == ar_pos and {k: v for k, v in e3.items() if k != "--speculative-config"} == ar
    # the DFlash blog's EAGLE-3 baseline for Qwen3-8B, with its 7 speculative tokens
    assert e3["--speculative-config"] == {"method": "eagle3", "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
                                          "num_speculative_tokens": 7}
    head = models.resolve("Qwen3-8B", eagle3="./my-head")
    assert parse(vllm.command(head, "eagle3", 8000))[1]["--speculative-config"]["model"] == "./my-head"
    with pytest.raises(UserError, match="has no EAGLE-3 head known here: pass --eagle3"):
        vllm.command(models.resolve("gemma-4-31B-it"), "eagle3", 8000)


def test_engines_without_an_eagle3_server_refuse_the_mode_before_launch():
    pair = models.resolve("Qwen3-8B")
    for engine in ("sglang", "builtin", "llamacpp"):
        why = profiles.get(engine).refusal(pair, "eagle3", None)
        assert why is not None and "the eagle3 mode runs on vllm" in why
        assert profiles.get(engine).refusal(pair, "dflash", None) is None
    assert profiles.get("vllm").refusal(pair, "eagle3", "0.26.0") is None
    # a pair with no head known: its eagle3 cells fail before launch, saying what to pass
    why = profiles.get("vllm").refusal(models.resolve("gemma-4-31B-it"), "eagle3", "0.26.0")
    assert why is not None and "pass --eagle3" in why
    # the emulator stands in with a speculative server of the head's length (its tokens plus one)
    emulated = profiles.get("emulator").command(pair, "eagle3", 8000)
    assert emulated[emulated.index("--block-size") + 1] == "8" and emulated[emulated.index("--mode") + 1] == "dflash"


def test_an_eagle3_server_draws_the_same_tau_over_its_own_draft_length():
    from dflash_bench.synthetic import SyntheticProfile

    pair = models.resolve("Qwen3-8B")
    block = SyntheticProfile.from_tau(6.5, pair.block_size)
    df = parse(profiles.get("vllm").command(pair, "dflash", 8000, synthetic=block))[1]["--speculative-config"]
    e3 = parse(profiles.get("vllm").command(pair, "eagle3", 8000, synthetic=block))[1]["--speculative-config"]
    assert e3["rejection_sample_method"] == df["rejection_sample_method"] == "synthetic"
    assert len(df["synthetic_acceptance_rates"]) == 15 and len(e3["synthetic_acceptance_rates"]) == 7
    for rates in (df["synthetic_acceptance_rates"], e3["synthetic_acceptance_rates"]):
        assert 1 + sum(rates) == pytest.approx(6.5, abs=1e-4)
    # past what 7 drafts can commit, the head's tau is capped at 8
    high = parse(profiles.get("vllm").command(pair, "eagle3", 8000, synthetic=SyntheticProfile.from_tau(9.0, 16)))[1]
    assert 1 + sum(high["--speculative-config"]["synthetic_acceptance_rates"]) == pytest.approx(8.0, abs=1e-4)
