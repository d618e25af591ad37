import pytest

from dflash_bench.errors import UserError
from dflash_bench.sweep.plan import SweepSettings, check_resume, launches, plan_cells
from dflash_bench.store.provenance import redact


def _settings(**kw):
    base = dict(model="Qwen3-8B", engines=["vllm"], suites=["gsm8k", "mt-bench"], concurrency=[1, 8])
    return SweepSettings(**(base | kw))


def test_plan_covers_every_cell_once():
    plan = plan_cells(_settings(repeats=2, engines=["vllm", "sglang"]))
    assert len(plan) == 2 * 2 * 2 * 2 * 2
    assert len({c.cell_id for c in plan}) == len(plan)


def test_repeats_alternate_modes_and_share_launches():
    plan = plan_cells(_settings(repeats=3))
    groups = launches(plan)
    # AR r0 | DFlash r0 + DFlash r1 | AR r1 + AR r2 | DFlash r2
    assert [(g.mode, sorted({c.repeat for c in g.cells})) for g in groups] == [
        ("ar", [0]), ("dflash", [0, 1]), ("ar", [1, 2]), ("dflash", [2])]
    assert all(len(g.cells) in (4, 8) for g in groups)


def test_paired_cells_alternate_modes_and_each_engine_keeps_one_server_per_mode():
    """Paired: every (suite, concurrency) AR then DFlash (DFlash first on odd repeats, as unpaired), and the
    launches are one per (engine, mode) over the engine's cells, whatever their order."""
    plan = plan_cells(_settings(repeats=2, engines=["vllm", "sglang"], paired=True))
    first = [(c.mode, c.suite, c.concurrency) for c in plan if c.engine == "vllm" and c.repeat == 0]
    assert first == [(m, s, c) for s in ("gsm8k", "mt-bench") for c in (1, 8) for m in ("ar", "dflash")]
    assert [c.mode for c in plan if c.engine == "vllm" and c.repeat == 1][:2] == ["dflash", "ar"]
    assert sorted(c.cell_id for c in plan) == sorted(c.cell_id for c in plan_cells(_settings(repeats=2,
                                                                                             engines=["vllm", "sglang"])))
    groups = launches(plan, paired=True)
    assert [(g.engine, g.mode, len(g.cells)) for g in groups] == [
        ("vllm", "ar", 8), ("vllm", "dflash", 8), ("sglang", "ar", 8), ("sglang", "dflash", 8)]
    assert max(len(g.cells) for g in launches(plan)) == 2  # grouped by runs of one mode: a server every cell or two


def test_launches_skip_complete_cells():
    plan = plan_cells(_settings())
    for c in plan[:5]:
        c.status = "complete"
    groups = launches(plan)
    assert [c.cell_id for g in groups for c in g.cells] == [c.cell_id for c in plan[5:]]


@pytest.mark.parametrize("kw, message", [
    # each option's declared range and rule, for values no command line gave (the demo's, a resumed manifest's)
    (dict(concurrency=[0]), "--concurrency takes positive integers"),
    (dict(concurrency=[8, 8]), "--concurrency lists a value twice"),
    (dict(repeats=0), "--repeats must be at least 1, not 0"),
    (dict(port=70000), "--port must be at most 65535, not 70000"),
    (dict(input_lens=[1024, 1024]), "--input-len takes distinct positive lengths"),
    (dict(steady_ramp=-1), "--steady-ramp must be at least 0, not -1"),
    # the names options give, and the rules between options and of the client's load
    (dict(gpu="h300"), "unknown GPU preset 'h300'"),
    (dict(suites=["gsm8k", "nope"]), "nope"),
    (dict(slo="tok_s_user=0"), "--slo tok_s_user must be a positive number"),
    (dict(suites=[]), "no suites"),
    (dict(url_ar="http://x:1"), "both"),
    (dict(interleave=True), "add --paired"),
    (dict(steady_requests=4), "--steady-requests 4 is smaller than the concurrency 8"),
    (dict(steady_ramp=2), "--steady-ramp needs --steady-requests"),
    (dict(engine_args=["--api-key=sk-abc"]), "carries a secret"),
    (dict(modes=["ar", "eagle2"]), "--modes takes distinct modes of ar, dflash, eagle3"),
    (dict(modes=["ar", "ar"]), "--modes takes distinct modes"),
    (dict(modes=["ar", "dflash", "eagle3"], paired=True), "leave --modes at ar,dflash"),
])
def test_bad_settings_are_refused_in_one_sentence_before_anything_launches(kw, message):
    from dflash_bench.sweep.check import checked

    with pytest.raises(UserError, match=message):
        checked(_settings(**kw).model_dump())


def test_the_check_completes_what_was_not_given():
    """A runner not given follows the engines (process where every one runs as a process), and "all" is every suite
    but speed-bench, by name: the manifest stores what ran."""
    from dflash_bench.suites import list_suites
    from dflash_bench.sweep.check import checked

    values = {k: v for k, v in _settings(engines=["emulator"], suites=["all"]).model_dump().items() if k != "runner"}
    settings = checked(values)
    assert settings.runner == "process" and checked({**values, "engines": ["vllm"]}).runner == "docker"
    assert settings.suites == [s.name for s in list_suites() if s.name != "speed-bench"] and "gsm8k" in settings.suites


def test_what_the_executor_or_its_options_cannot_take_is_refused_with_the_settings():
    from dflash_bench.sweep.check import checked

    good = _settings().model_dump()
    with pytest.raises(UserError, match="--executor slurm runs one job per server: drop --paired"):
        checked(_settings(paired=True).model_dump(), executor="slurm")
    with pytest.raises(UserError, match="drop --url-ar/--url-dflash"):
        checked(_settings(url_ar="http://x:1", url_dflash="http://x:2").model_dump(), executor="slurm")
    with pytest.raises(UserError, match="--partition, --account, --time, --gpus-per-node, --gpu-type and --sbatch-arg "
                                        "need --executor slurm"):
        checked(good, slurm={"partition": "gpu"})
    with pytest.raises(UserError, match="--gpu-type lists a GPU type twice"):
        checked(good, executor="slurm", slurm={"gpu_type": "h100,h100"})
    with pytest.raises(UserError, match="--executor is local or slurm, not 'k8s'"):
        checked(good, executor="k8s")


def test_resume_refuses_changed_settings_but_not_runner():
    saved = _settings().identity()
    check_resume(saved, _settings(runner="process"))
    with pytest.raises(UserError, match="max_tokens"):
        check_resume(saved, _settings(max_tokens=64))


def test_redact_hides_secret_values():
    argv = ["sweep", "--hf-token", "hf_abc", "--api-key=sk-1", "--model", "x"]
    assert redact(argv) == ["sweep", "--hf-token", "***", "--api-key=***", "--model", "x"]
    # nested in an engine argument, or a bare token; token counts and the tokenizer stay readable
    argv = ["--engine-arg=--hf-token=hf_abcdefghijk", "--engine-arg=--api-key", "sk-2", "--engine-arg=hf_abcdefghijk",
            "--max-tokens", "48", "--tokenizer", "org/m", "--engine-arg=--max-num-batched-tokens=8192"]
    assert redact(argv) == ["--engine-arg=--hf-token=***", "--engine-arg=--api-key", "***", "--engine-arg=hf_***",
                            "--max-tokens", "48", "--tokenizer", "org/m", "--engine-arg=--max-num-batched-tokens=8192"]


def test_a_changed_image_digest_between_modes_is_noted():
    from dflash_bench.store import Manifest
    from dflash_bench.sweep.launch import check_same_image

    server = {"runner": "docker", "url": "http://127.0.0.1:8000", "image_digest": "sha256:a"}
    m = Manifest(sweep_id="s", servers={"vllm-ar": server, "vllm-dflash": server})
    check_same_image(m, "vllm")
    assert m.notes == []
    m.servers["vllm-dflash"].image_digest = "sha256:b"
    check_same_image(m, "vllm")
    check_same_image(m, "vllm")
    assert len(m.notes) == 1 and "sha256:a vs sha256:b" in m.notes[0]


def test_resume_compares_the_saved_typed_settings(tmp_path):
    """The manifest keeps SweepSettings; resume compares what is measured, never the launcher's port or runner."""
    from dflash_bench.store import Manifest, SweepDir

    saved = _settings(port=18001, runner="process")
    sweep = SweepDir.create(tmp_path / "s", Manifest(sweep_id="s", settings=saved, plan=plan_cells(saved)))
    back = sweep.read_manifest().settings
    assert back == saved
    check_resume(back, _settings(port=8000, runner="docker"))
    with pytest.raises(UserError, match="max_tokens"):
        check_resume(back, _settings(max_tokens=99))
    with pytest.raises(UserError, match="no sweep settings"):
        check_resume(None, saved)


def test_a_cell_measured_again_starts_from_an_empty_folder(tmp_path):
    from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir
    from dflash_bench.sweep.measure import clear_attempt

    cell = CellPlan(cell_id="e-ar-gsm8k-c1", engine="e", mode="ar", suite="gsm8k", concurrency=1, status="failed")
    sweep = SweepDir.create(tmp_path / "s", Manifest(sweep_id="s", plan=[cell]))
    manifest = sweep.read_manifest()
    sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="e", mode="ar", suite="gsm8k", concurrency=1,
                                    status="failed", failure_reason="server died"))
    (sweep.cell_dir(cell.cell_id) / "telemetry.csv").write_text("t_s,power_w\n0,100\n")
    clear_attempt(sweep, manifest, cell)
    assert not sweep.cell_dir(cell.cell_id).exists()
    assert manifest.notes == ["e-ar-gsm8k-c1: measured again after a failed attempt (server died)"]
    sweep.cell_dir(cell.cell_id).mkdir(parents=True)  # a kill mid-write left a broken summary: cleared all the same
    (sweep.cell_dir(cell.cell_id) / "summary.json").write_text('{"cell_id": ')
    clear_attempt(sweep, manifest, cell)
    assert not sweep.cell_dir(cell.cell_id).exists()


@pytest.mark.parametrize("model, engine, args, expected", [
    ("Qwen3-8B", "vllm", [], [0]),  # one GPU however many the host has
    ("Qwen3.5-122B-A10B", "sglang", [], [0, 1, 2, 3]),  # the card's --tp-size 4
    ("Qwen3.5-122B-A10B", "vllm", [], [0, 1, 2, 3]),
    ("Qwen3-8B", "vllm", ["--tensor-parallel-size=2"], [0, 1]),
])
def test_telemetry_watches_the_gpus_the_server_uses(model, engine, args, expected):
    from dflash_bench import models
    from dflash_bench.sweep.telemetry import server_devices

    settings = _settings(model=model, engines=[engine], engine_args=args)
    assert server_devices(settings, models.resolve(model)) == expected
    external = _settings(model=model, engines=[engine], url_ar="http://a:1", url_dflash="http://b:1")
    assert server_devices(external, models.resolve(model)) is None


def test_modes_add_an_eagle3_server_and_alternate_with_the_repeats():
    plan = plan_cells(_settings(repeats=2, modes=["ar", "dflash", "eagle3"]))
    # ar r0 | dflash r0 | eagle3 r0 + eagle3 r1 | dflash r1 | ar r1
    assert [(g.mode, sorted({c.repeat for c in g.cells})) for g in launches(plan)] == [
        ("ar", [0]), ("dflash", [0]), ("eagle3", [0, 1]), ("dflash", [1]), ("ar", [1])]
    assert "vllm-eagle3-gsm8k-c8-r1" in {c.cell_id for c in plan}


def test_a_sweep_saved_before_modes_existed_resumes_with_the_default_modes():
    old = {k: v for k, v in _settings().model_dump().items() if k != "modes"}
    check_resume(old, _settings())
    with pytest.raises(UserError, match="modes"):
        check_resume(old, _settings(modes=["ar", "dflash", "eagle3"]))
