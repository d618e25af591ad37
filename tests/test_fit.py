"""Sizing a plan for its GPUs from configs alone: the context limit, the engines' flags, the refusal of a plan
that cannot fit, tensor parallelism, and vLLM's DFlash refusal for a drafter that mixes layer types."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_bench import models, profiles
from dflash_bench.errors import UserError
from dflash_bench.launch import free_port
from dflash_bench.model_shapes import (GEMMA4_26B_A4B_TARGET, GEMMA4_31B_DRAFTER, GEMMA4_31B_TARGET, mixes_layer_types,
                                      pair_configs)
from dflash_bench.settings import SweepSettings
from dflash_bench.sweep import fit

ROOT = Path(__file__).resolve().parents[1]
GEMMA = models.resolve("gemma-4-31B-it")


def test_gemma_geometry_matches_the_published_sizes():
    g = fit.geometry(GEMMA4_31B_TARGET)
    assert g is not None
    # about 62 GB of bf16 weights (30.7 B parameters)
    assert 60e9 < g.weight_bytes < 63e9
    # 10 full layers keep every token: 4 KV heads x 512 x K and V x 2 bytes; 50 sliding layers keep their window
    assert g.kv_full == 10 * 2 * 4 * 512 * 2
    assert g.kv_window == 50 * 2 * 16 * 256 * 2
    assert g.window == 1024
    # the third-party figure: about 3.5 GB at 32k tokens
    assert 3.4e9 < g.kv_bytes(32768) < 3.6e9
    assert g.kv_bytes(4096) - g.kv_bytes(2048) == 2048 * g.kv_full  # past the window only full layers grow


def test_a_mixture_holds_every_expert_and_a_token_reads_its_share():
    # gemma-4-26B-A4B: 25.2B parameters, 3.8B a token (the model card's figures), 128 experts beside a dense MLP
    g = fit.geometry(GEMMA4_26B_A4B_TARGET)
    assert g is not None and (g.experts, g.experts_per_token) == (128, 8)
    assert 25.1e9 < g.weight_bytes / 2 < 25.3e9
    assert 3.7e9 < g.active_bytes / 2 < 3.9e9
    # 5 full layers of 2 KV heads x 512, 25 sliding layers of 8 x 256 within their window of 1024
    assert (g.kv_full, g.kv_window, g.window) == (5 * 2 * 2 * 512 * 2, 25 * 2 * 8 * 256 * 2, 1024)
    dense = fit.geometry({**GEMMA4_26B_A4B_TARGET, "enable_moe_block": False})
    assert dense is not None and dense.experts == 0
    assert g.weight_bytes - dense.weight_bytes == 30 * (128 * 3 * 2816 * 704 + 2816 * 128) * 2


def test_qwen_and_gpt_oss_mixtures_match_their_published_sizes():
    qwen3_30b_a3b = dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, intermediate_size=6144, vocab_size=151936, num_experts=128,
                         num_experts_per_tok=8, moe_intermediate_size=768, tie_word_embeddings=False)
    g = fit.geometry(qwen3_30b_a3b)
    assert g is not None and 30.4e9 < g.weight_bytes / 2 < 30.6e9  # "30.5B total, 3.3B activated" (embedding in)
    assert 3.2e9 < (g.active_bytes + 151936 * 2048 * 2) / 2 < 3.4e9
    # a dense first layer (mlp_only_layers) holds one MLP of intermediate_size instead of the experts
    first_dense = fit.geometry({**qwen3_30b_a3b, "mlp_only_layers": [0]})
    assert first_dense is not None
    assert g.weight_bytes - first_dense.weight_bytes == (128 * 3 * 2048 * 768 + 2048 * 128 - 3 * 2048 * 6144) * 2
    gpt_oss_120b = dict(hidden_size=2880, num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8,
                        head_dim=64, intermediate_size=2880, vocab_size=201088, num_local_experts=128,
                        experts_per_token=4, tie_word_embeddings=False, sliding_window=128,
                        layer_types=["sliding_attention", "full_attention"] * 18)
    g = fit.geometry(gpt_oss_120b)
    assert g is not None and 116.7e9 < g.weight_bytes / 2 < 116.9e9 and 5.0e9 < g.active_bytes / 2 < 5.2e9
    assert (g.kv_full, g.kv_window, g.window) == (18 * 2 * 8 * 64 * 2, 18 * 2 * 8 * 64 * 2, 128)
    # its MXFP4 experts: about 65 GB in memory, as its checkpoint is
    mx = fit.geometry({**gpt_oss_120b, "quantization_config": {"quant_method": "mxfp4"}})
    assert mx is not None and 64e9 < mx.weight_bytes < 66e9


def test_the_gpt_oss_120b_shape_has_the_published_sizes_and_its_folders_render_harmony_turns(tmp_path):
    """The target's config gives its MXFP4 checkpoint's 65 GB; the drafter's second-hand shape must come to the one
    file its repository holds, 1.46 GiB (0.78B parameters: the card's 0.8B), shared embedding and head left out."""
    from benchmarks.fixtures.shape_folders import write_shape
    from dflash_bench.model_shapes import shape_of

    target, drafter = shape_of("gpt-oss-120b")
    g, d = fit.geometry(target), fit.geometry(drafter, drafter=True)
    assert g is not None and 64e9 < g.weight_bytes < 66e9 and g.window == 128
    assert d is not None and 1.44 < d.weight_bytes / 2**30 < 1.48
    assert drafter["block_size"] == models.resolve("gpt-oss-120b").block_size == 10
    written = write_shape("gpt-oss-120b", tmp_path)
    assert written["renders"]["text"] == "<|start|>user<|message|>What is 7 * 6?<|end|><|start|>assistant"
    assert json.loads((Path(written["target"]) / "config.json").read_text())["model_type"] == "gpt_oss"


def test_what_the_formulas_do_not_cover_is_not_sized():
    assert fit.geometry({**GEMMA4_31B_TARGET, "n_routed_experts": 64}) is None  # latent attention (DeepSeek's)
    assert fit.geometry({**GEMMA4_31B_TARGET, "enable_moe_block": True}) is None  # a mixture without its widths
    assert fit.geometry({"hidden_size": 8}) is None


def test_one_h200_fits_the_moe_pair_and_the_dry_run_says_what_a_token_reads(data_dir, monkeypatch):
    from dflash_bench.sweep.dry_run import weights_line

    pair = models.resolve("gemma-4-26B-A4B-it")
    sized = fit.size(_settings(model="gemma-4-26B-A4B-it", gpu="h200"), pair, data_dir)
    assert sized.context_len is not None
    line = weights_line(pair)
    assert "a mixture of 128 experts, 8 a token" in line and line.startswith("target: 47.0 GiB of weights")
    # its weights (47 GiB, every expert) do not fit a GPU of 44 GiB, whatever a token reads
    monkeypatch.setitem(fit.GPU_MEMORY_GIB, "h100", 44.0)
    with pytest.raises(UserError, match="the weights alone do not fit"):
        fit.size(_settings(model="gemma-4-26B-A4B-it", gpu="h100", concurrency=[1]), pair, data_dir)


def _settings(**kw) -> SweepSettings:
    values = dict(model="gemma-4-31B-it", engines=["vllm"], suites=["gsm8k", "mt-bench"], concurrency=[1, 8, 32],
                  max_tokens=128, gpu="h100")
    return SweepSettings(**{**values, **kw})


def test_one_h100_refuses_32_sequences_and_says_what_fits(data_dir):
    with pytest.raises(UserError) as err:
        fit.size(_settings(), GEMMA, data_dir)
    text = str(err.value)
    assert "does not fit 1 H100" in text and "32 sequences" in text
    assert "--tensor-parallel-size 2" in text
    assert "a concurrency of at most" in text
    assert "\n" not in text  # one sentence


def test_two_h100s_fit_the_same_plan_and_the_limit_is_derived(data_dir):
    sized = fit.size(_settings(tensor_parallel=2), GEMMA, data_dir)
    assert sized.context_len is not None and sized.context_len % fit.ROUND == 0
    # the longest conversation plus the block, rounded up: at least the output cap of two mt-bench turns
    assert sized.context_len >= 2 * 128 + GEMMA.block_size
    args = fit.server_args(sized, "vllm")
    assert args[args.index("--max-model-len") + 1] == str(sized.context_len)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--max-num-seqs") + 1] == "32"


def test_tensor_parallel_passed_as_an_engine_arg_counts_as_the_option(data_dir):
    """The server runs on the GPUs its command names (profiles.server_gpus), however the size was passed."""
    for args in (["--tensor-parallel-size=2"], ["--tensor-parallel-size", "2"]):
        sized = fit.size(_settings(engine_args=args), GEMMA, data_dir)
        assert sized.context_len is not None
    with pytest.raises(UserError, match="does not fit 1 H100"):
        fit.size(_settings(engine_args=["--tensor-parallel-size=1"]), GEMMA, data_dir)


def test_a_target_tokenizer_that_does_not_load_is_one_sentence(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        fit.token_counter(str(tmp_path))


def test_weights_alone_too_large_ask_for_more_gpus(data_dir, monkeypatch):
    monkeypatch.setitem(fit.GPU_MEMORY_GIB, "h100", 44.0)  # a GPU of 44 GiB under a preset the engines know
    with pytest.raises(UserError, match="the weights alone do not fit: use --tensor-parallel-size 2"):
        fit.size(_settings(concurrency=[1]), GEMMA, data_dir)


def test_a_lower_concurrency_passes(data_dir):
    sized = fit.size(_settings(concurrency=[1, 8]), GEMMA, data_dir)
    assert sized.context_len


def test_generic_preset_and_external_servers_are_not_sized(data_dir):
    assert fit.size(_settings(gpu="generic"), GEMMA, data_dir).context_len is None
    external = _settings(url_ar="http://127.0.0.1:1", url_dflash="http://127.0.0.1:2")
    assert fit.size(external, GEMMA, data_dir).context_len is None


def test_each_engine_gets_its_own_sizing_flags():
    vllm = profiles.get("vllm").sizing_flags(1024, 8, 2)
    assert vllm[:6] == ["--max-model-len", "1024", "--gpu-memory-utilization", "0.92", "--max-num-seqs", "8"]
    sglang = profiles.get("sglang").sizing_flags(1024, 8, 2)
    assert sglang == ["--context-length", "1024", "--mem-fraction-static", "0.88", "--max-running-requests", "8",
                      "--tp-size", "2"]
    assert profiles.get("builtin").sizing_flags(1024, 8, None) == ["--max-model-len", "1024", "--max-slots", "8"]
    assert profiles.get("builtin").sizing_flags(1024, 8, 2) == ["--max-model-len", "1024", "--max-slots", "8",
                                                                "--tensor-parallel-size", "2"]  # serve --fast shards
    with pytest.raises(UserError, match="llamacpp engine runs on one GPU"):
        profiles.get("llamacpp").sizing_flags(1024, 8, 2)
    assert profiles.get("vllm").sizing_flags(None, 8, 2) == ["--tensor-parallel-size", "2"]


def test_the_users_engine_args_come_last_so_they_win(data_dir):
    sized = fit.size(_settings(concurrency=[1], engine_args=["--max-model-len", "4096"]), GEMMA, data_dir)
    args = fit.server_args(sized, "vllm")
    assert args[-2:] == ["--max-model-len", "4096"] and args.index("--max-model-len") < len(args) - 2


def test_server_gpus_is_one_answer_for_telemetry_slurm_and_report():
    settings = _settings(tensor_parallel=2)
    assert profiles.server_gpus("vllm", GEMMA, settings) == 2
    assert profiles.server_gpus("emulator", GEMMA, settings) == 0
    assert profiles.server_gpus("vllm", GEMMA, _settings()) == 1
    card = _settings(engine_args=["--tp-size", "1", "--tp-size", "4"])
    assert profiles.server_gpus("sglang", GEMMA, card) == 4  # the last flag wins, as in the engine
    assert profiles.recorded_gpus({"vllm-ar": {"gpus": 2, "command": ["vllm"]}}, {}) == 2
    assert profiles.recorded_gpus({}, {"tensor_parallel": 2}) == 2
    assert profiles.recorded_gpus({"vllm-ar": {"command": ["vllm", "--tensor-parallel-size", "2"]}}, {}) == 2
    assert profiles.recorded_gpus({}, {}) is None


def test_vllm_refuses_dflash_on_a_mixed_drafter_before_launch_where_its_version_is_known():
    vllm = profiles.get("vllm")
    assert mixes_layer_types(GEMMA4_31B_DRAFTER)
    why = vllm.refusal(GEMMA, "dflash", "0.25.1")
    assert why and why.startswith("vLLM 0.25.1 cannot run DFlash with this drafter")
    assert "vllm issue 40898" in why and "PR #41703" in why and "sglang" in why
    assert vllm.refusal(GEMMA, "ar", "0.25.1") is None
    assert vllm.refusal(GEMMA, "dflash", None) is None  # unknown: launched, and its log read
    assert vllm.refusal(GEMMA, "dflash", "0.31.0") is None
    assert vllm.refusal(models.resolve("Qwen3-8B"), "dflash", "0.25.1") is None
    assert vllm.version("docker", "vllm/vllm-openai:v0.25.1") == "0.25.1"
    assert vllm.version("docker", "my/vllm:latest") is None


def test_vllm_names_the_cause_from_its_log():
    log = ("(EngineCore pid=1560) NotImplementedError: DFlash does not yet support mixed sliding/full attention "
           "via layer_types; see https://github.com/vllm-project/vllm/issues/40898.")
    assert profiles.get("vllm").failure(log).startswith("this vLLM cannot run DFlash with this drafter")
    assert profiles.get("vllm").failure("CUDA out of memory") is None
    v1 = ("NotImplementedError: DFlash drafters with mixed sliding/full attention require the V2 model runner; "
          "relaunch with VLLM_USE_V2_MODEL_RUNNER=1.")
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in profiles.get("vllm").failure(v1)


def test_vllm_notes_the_softcapping_its_dflash_leaves_out_where_it_starts():
    vllm = profiles.get("vllm")
    note = vllm.caveat(GEMMA, "dflash", "0.26.0")
    assert note and note.startswith("vLLM 0.26.0 drafts without the drafter's final-logit softcapping (30)")
    assert "temperature 0" in note
    assert vllm.caveat(GEMMA, "ar", "0.26.0") is None
    assert vllm.caveat(models.resolve("Qwen3-8B"), "dflash", "0.26.0") is None  # a drafter with no cap
    assert profiles.get("sglang").caveat(GEMMA, "dflash", "0.5.17") is None


def test_the_shape_writer_writes_folders_the_sizing_reads(tmp_path, data_dir):
    from benchmarks.fixtures.shape_folders import write_shape

    written = write_shape("gemma-4-31B-it", tmp_path)  # one token a byte: no training in a test
    assert written["renders"]["text"] == "<bos><start_of_turn>user\nWhat is 7 * 6?<end_of_turn>\n<start_of_turn>model\n"
    pair = models.resolve(written["target"], drafter=written["drafter"])
    target, drafter = pair_configs(pair)
    assert fit.geometry(target) == fit.geometry(GEMMA4_31B_TARGET)
    assert drafter["dflash_config"]["target_layer_ids"] == [1, 12, 23, 35, 46, 57]
    assert not (Path(written["target"]) / "model.safetensors").exists()  # the engines make the weights
    # the local folder's tokenizer counts the prompts: one token a byte makes longer contexts than the estimate
    local = fit.size(_settings(model=written["target"], concurrency=[1], engine_options={"drafter": written["drafter"]}),
                     pair, data_dir)
    named = fit.size(_settings(concurrency=[1]), GEMMA, data_dir)
    assert local.context_len > named.context_len


def test_dry_run_shows_the_derived_limit_and_refuses_what_cannot_fit(data_dir):
    base = [sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine", "vllm",
            "--gpu", "h100", "--dry-run", "--data-dir", str(data_dir), "--suites", "gsm8k,mt-bench",
            "--max-tokens", "128"]
    ok = subprocess.run(base + ["-c", "1,8"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    limit = next(line for line in ok.stdout.splitlines() if line.startswith("context limit"))
    n = int(limit.split()[2])
    assert f"--max-model-len {n} --gpu-memory-utilization 0.92 --max-num-seqs 8" in ok.stdout
    refused = subprocess.run(base + ["-c", "1,8,32"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--tensor-parallel-size 2" in refused.stderr
    tp = subprocess.run(base + ["-c", "1,8,32", "--tensor-parallel-size", "2"], capture_output=True, text=True,
                        cwd=ROOT)
    assert tp.returncode == 0, tp.stderr
    assert "--tensor-parallel-size 2" in tp.stdout


def test_a_dflash_budget_its_drafting_slots_use_up_is_refused_and_one_too_small_to_verify_every_row_is_said(data_dir):
    """vLLM sets aside (block - 2) tokens a row of --max-num-batched-tokens for DFlash's drafting: a plan that leaves
    nothing is refused before anything launches, naming the budget that fits; one whose cells' verify (a block a row)
    does not fit in what is left says which concurrencies wait, as EAGLE-3's (no slots set aside) does for its own."""
    base = [sys.executable, "-m", "dflash_bench", "sweep", "--model", "gpt-oss-120b", "--engine", "vllm", "--gpu",
            "h200", "--tensor-parallel-size", "2", "--dry-run", "--data-dir", str(data_dir), "--suites", "gsm8k",
            "-n", "1", "--max-tokens", "1024", "--synthetic-acceptance", "6.5"]
    refused = subprocess.run(base + ["-c", "512,1024", "--engine-arg=--max-num-batched-tokens=8192"],
                             capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "sets aside 8,192 of --max-num-batched-tokens 8,192" in refused.stderr  # 1024 rows x 8 slots (block 10)
    assert "--engine-arg=--max-num-batched-tokens=18432" in refused.stderr  # 1024 x (8 + 10)
    noted = subprocess.run(base + ["-c", "64,512", "--engine-arg=--max-num-batched-tokens=8192"],
                           capture_output=True, text=True, cwd=ROOT)
    assert noted.returncode == 0, noted.stderr
    (note,) = [line for line in noted.stdout.splitlines() if "a step" in line and "note:" in line]
    assert "leaves 4,096 a step: at c = 512 rows beyond 409 wait" in note  # c=64's 640 tokens fit
    fits = subprocess.run(base + ["-c", "512,1024", "--engine-arg=--max-num-batched-tokens=18432"],
                          capture_output=True, text=True, cwd=ROOT)
    assert fits.returncode == 0 and "wait a step" not in fits.stdout, fits.stderr
    budget = profiles.get("vllm").verify_budget
    pair = models.resolve("Qwen3-8B")
    argv = ["vllm", "serve", "m", "--max-num-batched-tokens", "512", "--max-num-seqs", "128"]
    assert budget(pair, "eagle3", argv) == (512, 0, pair.eagle3_tokens + 1)  # serial drafting: nothing set aside
    assert budget(pair, "dflash", argv) == (512, 128 * (pair.block_size - 2), pair.block_size)
    assert budget(pair, "ar", argv) is None and budget(pair, "dflash", argv[:3]) is None
    assert profiles.get("sglang").verify_budget(pair, "dflash", argv) is None


def test_a_speculative_vllm_server_is_launched_below_the_memory_its_verify_logits_take(data_dir):
    """vLLM sizes its KV cache after a profile whose sampler sees one draft a row, where a verify holds every draft
    position's logits (gpt-oss-120b's DFlash died of it at 896 rows on one H200): the speculative server is launched
    at the engine's memory fraction less those bytes, the AR server at the engine's own, the fit counts them, the
    launch and the dry run say so, and the user's own --gpu-memory-utilization still comes last."""
    from dflash_bench.profiles.vllm import VERIFY_LOGIT_BYTES
    from dflash_bench.sweep.launch import launch_notes

    pair = models.resolve("gpt-oss-120b")
    vocab = pair_configs(pair)[0]["vocab_size"]

    def plan(concurrency: list[int], *extra: str) -> SweepSettings:
        return fit.size(_settings(model="gpt-oss-120b", gpu="h200", tensor_parallel=2, suites=["gsm8k"],
                                  num_prompts=1, max_tokens=1024, concurrency=concurrency, modes=["ar", "dflash"],
                                  engine_args=["--max-num-batched-tokens=18432", *extra]), pair, data_dir)

    def fraction(settings: SweepSettings, mode: str) -> float:
        args = fit.server_args(settings, "vllm", pair, mode)
        return float(args[args.index("--gpu-memory-utilization") + 1])

    wide, narrow = plan([512, 1024]), plan([64])
    engine = profiles.get("vllm").memory_fraction
    assert fraction(wide, "ar") == fraction(narrow, "ar") == engine  # AR verifies nothing
    held = 1024 * (pair.block_size - 2) * vocab * VERIFY_LOGIT_BYTES  # 1024 rows, 9 drafts, one of them profiled
    assert fraction(wide, "dflash") == math.floor((engine - held / (fit.gpu_memory_gib("h200") * fit.GIB)) * 100) / 100
    assert fraction(wide, "dflash") < fraction(narrow, "dflash") < engine  # more rows, more logits
    assert fit.server_args(wide, "vllm") == fit.server_args(wide, "vllm", pair, "ar")  # the engine-wide flags: AR's
    # rows beyond what the token budget verifies in a step hold nothing: at 1,024 tokens, (1024 - 64 x 8) // 10 rows
    budget = plan([64], "--max-num-batched-tokens=1024")
    rows = (1024 - 64 * (pair.block_size - 2)) // pair.block_size
    assert fit.sampler_fraction(budget, pair, "vllm", "dflash")[1] == rows * (pair.block_size - 2) * vocab * VERIFY_LOGIT_BYTES
    (note,) = [n for n in launch_notes(wide, pair, "vllm", "dflash", "0.26.0") if "holds back" in n]
    assert "at 1024 rows" in note and f"memory fraction of {fraction(wide, 'dflash'):g}" in note
    assert not [n for n in launch_notes(wide, pair, "vllm", "ar", "0.26.0") if "holds back" in n]
    # the user's --gpu-memory-utilization, after the sizing flags, is the one vLLM takes
    own = fit.server_args(plan([64], "--gpu-memory-utilization=0.5"), "vllm", pair, "dflash")
    assert own[-1] == "--gpu-memory-utilization=0.5"
    # the fit counts them: one H200 holds gpt-oss-120b's AR at 896 rows, not its DFlash beside those logits
    one = dict(model="gpt-oss-120b", gpu="h200", suites=["gsm8k"], num_prompts=1, max_tokens=1024, concurrency=[896],
               engine_args=["--max-num-batched-tokens=18432"])
    assert fit.size(_settings(**one, modes=["ar"]), pair, data_dir).context_len
    with pytest.raises(UserError, match="GiB a GPU its verify's logits hold: use --tensor-parallel-size 2"):
        fit.size(_settings(**one, modes=["ar", "dflash"]), pair, data_dir)
    # SGLang's profile holds back nothing: its fraction is its own in both modes
    assert profiles.get("sglang").sampler_reserve(pair, "dflash", ["python3", "--max-running-requests", "64"]) == 0


def test_config_file_round_trip(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GEMMA4_31B_TARGET))
    from dflash_bench.model_shapes import read_config

    assert read_config(tmp_path) == GEMMA4_31B_TARGET
    assert read_config(tmp_path / "missing") is None


def test_a_sweep_fails_vllms_dflash_cells_with_the_sentence_and_never_launches_them(tmp_path, data_dir):
    """The process runner's vLLM is 0.25.1 (its distribution metadata, as the offline bundle installs it):
    the DFlash server is refused before launch; the AR server is launched (and fails here: no vLLM to run)."""
    site = tmp_path / "site" / "vllm-0.25.1.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.1\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{site.parent}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    out = tmp_path / "out"
    got = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine", "vllm",
                          "--runner", "process", "-c", "1", "--suites", "gsm8k", "-n", "1", "--data-dir", str(data_dir),
                          "--port", str(free_port()), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert "Traceback" not in got.stderr
    folders = [p.parent for p in out.glob("*/manifest.json")]
    assert len(folders) == 1, got.stderr[-2000:]
    [folder] = folders
    manifest = json.loads((folder / "manifest.json").read_text())
    reasons = {c["cell_id"]: c.get("reason") or "" for c in manifest["plan"]}
    assert reasons["vllm-dflash-gsm8k-c1"].startswith("server did not start: vLLM 0.25.1 cannot run DFlash with this drafter")
    assert "vllm-dflash" not in " ".join(manifest.get("servers", {}))  # never launched
    assert "cannot run DFlash" not in reasons["vllm-ar-gsm8k-c1"]


def test_a_drafter_vllm_will_not_load_does_not_count_against_its_memory(data_dir, monkeypatch):
    """vLLM 0.25.1 refuses this pair's DFlash server, so only the target's weights share the GPU with the KV."""
    context = fit.size(_settings(concurrency=[1], num_prompts=16), GEMMA, data_dir).context_len
    target, drafter = fit.geometry(GEMMA4_31B_TARGET), fit.geometry(GEMMA4_31B_DRAFTER, drafter=True)
    usable = fit.usable_gib("vllm", fit.GPU_MEMORY_GIB["h100"])
    c = next(c for c in range(1, 64) if not fit.fit(target, drafter, usable=usable, gpus=1, context=context,
                                                    concurrency=c).fits)
    assert fit.fit(target, None, usable=usable, gpus=1, context=context, concurrency=c).fits  # the case exists
    with pytest.raises(UserError, match=f"{c} sequences"):
        fit.size(_settings(concurrency=[c], num_prompts=16), GEMMA, data_dir)  # version unknown: the DFlash server may launch
    monkeypatch.setattr(type(profiles.get("vllm")), "version", lambda self, runner, image: "0.25.1")
    assert fit.size(_settings(concurrency=[c], num_prompts=16), GEMMA, data_dir).context_len == context


def test_the_sweeps_tables_show_tok_s_per_gpu_for_a_sharded_server():
    from rich.console import Console

    from dflash_bench.store import CellSummary
    from dflash_bench.sweep.progress import cells_table

    s = CellSummary(cell_id="vllm-ar-gsm8k-c32", engine="vllm", mode="ar", suite="gsm8k", concurrency=32,
                    status="complete", output_throughput=1864.9)
    console = Console(width=200, record=True)
    console.print(cells_table([s], 2))
    text = console.export_text()
    assert "tok/s per GPU" in text and "932.5" in text and "2 GPUs per server" in text
    console = Console(width=200, record=True)
    console.print(cells_table([s], 1))
    assert "per GPU" not in console.export_text()


def test_sglangs_naming_of_gemma_4_is_the_same_model_to_the_sizing():
    from dflash_bench.model_shapes import sglang_naming

    named = sglang_naming(GEMMA4_31B_TARGET)
    assert named["head_dim"] == 512 and named["swa_head_dim"] == 256 and named["swa_num_key_value_heads"] == 16
    assert "global_head_dim" not in named
    assert fit.geometry(named) == fit.geometry(GEMMA4_31B_TARGET)


def test_a_dry_run_without_the_prompts_prints_the_plan_unsized(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    got = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine", "vllm",
                          "--gpu", "h100", "--dry-run", "--data-dir", str(empty), "--suites", "gsm8k"],
                         capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    assert "context limit not derived (it needs the plan's prompts)" in got.stdout
    assert "google/gemma-4-31B-it" in got.stdout and "--max-model-len" not in got.stdout


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_before_launch(data_dir):
    """gemma-4-31B has 32 attention heads: 3 GPUs cannot shard them (vLLM would only say so at launch)."""
    with pytest.raises(UserError, match="size of 3 does not divide the target's 32 attention heads.*use 1, 2, 4, 8"):
        fit.size(_settings(tensor_parallel=3), GEMMA, data_dir)
    assert fit.size(_settings(tensor_parallel=4), GEMMA, data_dir).context_len  # a divisor is sized as before


# ---- the builtin engine: its own pool's slot (engine/fast/pool.slot_bytes), Gemma 4's rings and the drafter's layers


def gemma_slot(tokens: int, *, fast: bool = True) -> int:
    """One slot of the builtin engine for gemma-4-31B-it + its drafter in bf16, by hand: 50 sliding layers of 16 KV
    heads x 256 (on the fast path a ring of the window 1024 + 48 + a spare row, once shorter than the length), 10 full
    layers of 4 x 512 (the value stored beside the key), the drafter's 5 layers of 8 x 128 at every position, and
    16 positions of float32 logits over 262144 tokens."""
    sliding = min(tokens, 1024 + 48 + 1) if fast and 1024 + 48 < tokens else tokens
    return (2 * 2 * (50 * 16 * 256 * sliding + 10 * 4 * 512 * tokens + 5 * 8 * 128 * tokens)
            + 16 * 262144 * 4)


def test_the_builtin_engines_slot_is_its_pools_own_arithmetic():
    pytest.importorskip("torch")
    fast = fit.builtin_kv(GEMMA4_31B_TARGET, GEMMA4_31B_DRAFTER, fast=True)
    reference = fit.builtin_kv(GEMMA4_31B_TARGET, GEMMA4_31B_DRAFTER, fast=False)
    assert fast is not None and reference is not None
    for tokens in (768, 1024, 1072, 1073, 2048, 4096):  # below, at and past the ring
        assert fast(tokens) == gemma_slot(tokens), tokens
        assert reference(tokens) == gemma_slot(tokens, fast=False), tokens  # serve without --fast keeps every position
    without = fit.builtin_kv(GEMMA4_31B_TARGET, None, fast=True)
    assert without is not None and without(4096) == gemma_slot(4096) - 2 * 2 * 5 * 8 * 128 * 4096 - 15 * 262144 * 4


def _builtin(**kw) -> SweepSettings:
    return _settings(engines=["builtin"], engine_args=["--fast"], **kw)


def test_32_builtin_rows_of_gemma_do_not_fit_one_h100_and_the_sentence_says_what_does(data_dir):
    pytest.importorskip("torch")
    context = fit.size(_builtin(gpu="h200"), GEMMA, data_dir).context_len  # the same plan fits one H200
    assert context is not None
    with pytest.raises(UserError) as err:
        fit.size(_builtin(), GEMMA, data_dir)
    text = str(err.value)
    weights = fit.geometry(GEMMA4_31B_TARGET).weight_bytes + fit.geometry(GEMMA4_31B_DRAFTER, drafter=True).weight_bytes
    room = int(fit.usable_gib("builtin", fit.GPU_MEMORY_GIB["h100"]) * fit.GIB) - weights
    assert f"32 sequences of {context} tokens ({32 * gemma_slot(context) / fit.GIB:.1f} GiB)" in text, text
    assert f"a concurrency of at most {room // gemma_slot(context)}" in text, text
    assert "use --tensor-parallel-size 2 or" in text and "H200" not in text  # serve --fast shards over two
    assert "\n" not in text
    assert fit.size(_builtin(concurrency=[1, room // gemma_slot(context)]), GEMMA, data_dir).context_len == context


def test_a_builtin_plan_on_two_gpus_counts_a_ranks_share(data_dir):
    """32 rows fit two H100s: each rank holds half the weights and half the KV heads (and the logits whole), and
    the server gets --tensor-parallel-size 2; without --fast (the reference engine does not shard) it is refused."""
    pytest.importorskip("torch")
    two = _builtin(tensor_parallel=2)
    context = fit.size(two, GEMMA, data_dir).context_len
    assert context is not None
    assert fit.server_args(fit.size(two, GEMMA, data_dir), "builtin")[-3:] == ["--tensor-parallel-size", "2", "--fast"]
    slot2 = fit.builtin_kv(GEMMA4_31B_TARGET, GEMMA4_31B_DRAFTER, fast=True, tp=2)
    assert slot2 is not None and slot2(context) == gemma_slot(context) + 16 * 262144 * 4  # the logits on both ranks
    with pytest.raises(UserError, match="builtin: --tensor-parallel-size 2 runs on the fast path"):
        fit.size(_settings(engines=["builtin"], tensor_parallel=2), GEMMA, data_dir)


def test_a_builtin_server_without_fast_is_sized_by_the_reference_engines_caches(data_dir):
    """The reference engine keeps every position in the sliding layers too: fewer rows fit than on the fast path."""
    pytest.importorskip("torch")
    plan = dict(concurrency=[1, 8], max_tokens=512)
    context = fit.size(_builtin(**plan), GEMMA, data_dir).context_len
    assert context is not None and context > 1024 + 48
    with pytest.raises(UserError, match=f"8 sequences of {context} tokens \\({8 * gemma_slot(context, fast=False) / fit.GIB:.1f} GiB\\)"):
        fit.size(_settings(engines=["builtin"], **plan), GEMMA, data_dir)


def test_dry_run_of_a_builtin_gemma_plan_refuses_32_rows_on_one_h100(data_dir):
    pytest.importorskip("torch")
    got = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine",
                          "builtin", "--engine-arg=--fast", "--gpu", "h100", "--dry-run", "--data-dir", str(data_dir),
                          "--suites", "gsm8k,mt-bench", "--max-tokens", "128", "-c", "1,8,32"],
                         capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    assert "builtin: the plan does not fit 1 H100" in got.stderr and "--tensor-parallel-size 2" in got.stderr
