"""The docker launcher against a real dockerd (.ci/run starts one: vfs storage, no bridge, host network).

No registry is reachable, so the test image is a skeleton root file system made with `docker import`; the
host's /usr, its Python, the project's virtualenv and the repository are bind-mounted read-only, and the
emulator, the builtin engine or a small test server run from them. Every container carries a label naming
this test run, so the tests can assert that none is left behind.
"""

from __future__ import annotations

import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from dflash_bench.launch import DockerOptions, ServerDied, free_port, launch_command
from benchmarks.fixtures.docker_image import host_python_mounts, skeleton_tar
from launch_helpers import server_argv, start_harness, stop_harness, wait_until
from services import service_missing

pytestmark = pytest.mark.docker
RUN_LABEL = "dflash-bench.test-run"


@pytest.fixture(scope="module")
def docker_cli():
    try:
        import docker

        cli = docker.from_env(timeout=20)
        cli.ping()
    except Exception as err:  # no daemon, no permission, no SDK
        service_missing("docker", f"no Docker daemon reachable ({type(err).__name__}: {err}); .ci/run starts one")
    return cli


@pytest.fixture(scope="module")
def image(docker_cli, tmp_path_factory):
    """(tag, run id): a skeleton image imported for this test run; removed with its containers afterwards."""
    run = uuid.uuid4().hex[:10]
    tar = skeleton_tar(tmp_path_factory.mktemp("rootfs") / "skeleton.tar")
    docker_cli.api.import_image_from_file(str(tar), repository="dflash-bench-test", tag=run)
    tag = f"dflash-bench-test:{run}"
    yield tag, run
    for cont in docker_cli.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run}"}):
        cont.remove(force=True)
    docker_cli.images.remove(tag, force=True)


@pytest.fixture(autouse=True)
def _no_container_outlives_its_test(docker_cli, image):
    """A test that fails half-way leaves no container for the next test of this run to trip over."""
    yield
    for cont in leftovers(docker_cli, image[1]):
        cont.remove(force=True)


def leftovers(cli, run: str) -> list:
    return cli.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run}"})


def options(image, **kw) -> DockerOptions:
    tag, run = image
    # No GPU, no HF cache; no memlock ulimit (the CI sandbox does not allow raising it).
    return DockerOptions(image=tag, gpus=None, hf_cache=False, shm_size=None, pull=False, ulimits=False,
                         mounts=host_python_mounts(), labels={RUN_LABEL: run}, **kw)


def emulator_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "emulate", "--mode", "dflash", "--port", str(port),
            "--ttft-ms", "5", "--itl-ms", "1", "--output-len", "8"]


def test_emulator_in_docker_ready_labelled_logged_and_removed(docker_cli, image, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    port, log = free_port(), tmp_path / "logs" / "emulator-dflash.log"
    with launch_command(emulator_argv(port), port=port, runner="docker", docker=options(image), log_path=log,
                        sweep_id="sweep-42", engine="emulator", mode="dflash", name="emulator-dflash") as server:
        models = httpx.get(server.url + "/v1/models").json()
        assert models["data"], models
        cont = docker_cli.containers.get(server.info.container_id)
        labels = cont.labels
        assert labels["dflash-bench"] == "1" and labels["dflash-bench.sweep"] == "sweep-42"
        assert labels["dflash-bench.mode"] == "dflash" and labels[RUN_LABEL] == image[1]
        host = cont.attrs["HostConfig"]
        assert host["NetworkMode"] == "host" and host["IpcMode"] == "host"
        assert "HF_TOKEN=hf_secret_value_123" in cont.attrs["Config"]["Env"]  # passed through ...
        info = server.info.model_dump_json()
        assert "hf_secret_value_123" not in info  # ... never recorded
        assert server.info.image == image[0] and server.info.image_digest.startswith("sha256:")
        checked = server.info.identity.summary()  # the container answers on the port: its listener, or
        assert f"port {port} was free" in checked and f"container {cont.short_id}" in checked  # said why not
        server.check()
    assert not leftovers(docker_cli, image[1])
    assert wait_until(log.exists) and log.read_text().strip()  # the container's output was collected


def test_exit_during_startup_gives_log_tail_and_no_container(docker_cli, image):
    port = free_port()
    with pytest.raises(ServerDied) as err:
        with launch_command(server_argv(port, "exit"), port=port, runner="docker", docker=options(image),
                            name="sglang-dflash"):
            pytest.fail("a server that exited must not be yielded")
    msg = str(err.value)
    assert msg.startswith("the sglang-dflash server exited during start-up with code 3")
    assert "start-up line 59" in msg and "start-up line 19" not in msg
    assert not leftovers(docker_cli, image[1])


def test_watchdog_notices_a_killed_container(docker_cli, image):
    port = free_port()
    with launch_command(server_argv(port), port=port, runner="docker", docker=options(image), name="vllm-ar") as server:
        docker_cli.containers.get(server.info.container_id).kill()
        assert server.died.wait(5.0), "the watchdog did not notice within 5 s"
        with pytest.raises(ServerDied, match=r"the vllm-ar server exited with code 137(.|\n)*test server listening"):
            server.check()
    assert not leftovers(docker_cli, image[1])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_harness_leaves_no_container(docker_cli, image, sig):
    port = free_port()
    opts = options(image).__dict__
    harness, cid = start_harness({"argv": server_argv(port), "port": port, "runner": "docker", "docker": opts})
    try:
        assert docker_cli.containers.get(cid).status == "running"
        harness.send_signal(sig)
        rc = harness.wait(timeout=60)
        assert rc != 0, "the harness must report the interruption"
        assert not leftovers(docker_cli, image[1])
    finally:
        stop_harness(harness)


def test_stop_removes_only_containers_whose_harness_is_gone(docker_cli, image, tmp_path):
    from dflash_bench.launch.docker import stop_leftovers

    port, port2 = free_port(), free_port()
    opts = options(image).__dict__
    harness, orphan = start_harness({"argv": server_argv(port), "port": port, "runner": "docker", "docker": opts,
                                     "log_path": str(tmp_path / "orphan.log")})
    harness.kill()  # SIGKILL: the harness cannot tear down
    stop_harness(harness)
    with launch_command(server_argv(port2), port=port2, runner="docker", docker=options(image)) as live:
        assert {c.id for c in leftovers(docker_cli, image[1])} == {orphan, live.info.container_id}
        removed = stop_leftovers(labels={RUN_LABEL: image[1]})
        assert len(removed) == 1 and orphan[:10] in removed[0]
        assert [c.id for c in leftovers(docker_cli, image[1])] == [live.info.container_id]
        live.check()
    assert not leftovers(docker_cli, image[1])


@pytest.mark.slow
@pytest.mark.engine
def test_builtin_engine_profile_in_docker(docker_cli, image, tmp_path):
    """`launch_server("builtin", ...)` runs the profile's own command in a container and serves DFlash."""
    pytest.importorskip("transformers")
    from dflash_bench import models
    from dflash_bench.testing.tiny import make_tiny_pair
    from dflash_bench.launch import launch_server

    target, drafter = make_tiny_pair(tmp_path / "tiny", block_size=4)
    pair = models.resolve(str(target), drafter=str(drafter))
    bindir = str(Path(sys.executable).parent)
    # The entrypoint of docker/Dockerfile's image, which the skeleton image lacks.
    opts = options(image, env={"PATH": f"{bindir}:/usr/bin:/bin"}, entrypoint=["dflash-bench", "serve", "--host", "0.0.0.0"])
    opts.mounts.append((str(tmp_path / "tiny"), str(tmp_path / "tiny"), "ro"))
    with launch_server("builtin", pair, "dflash", runner="docker", port=free_port(), docker=opts,
                       extra_args=["--device", "cpu", "--max-model-len", "256", "--max-slots", "2"],
                       ready_timeout=180, sweep_id="tiny") as server:
        assert server.info.command[:2] == ["--model", str(target)]  # after the image's entrypoint
        assert "vllm:spec_decode_num_drafts_total" in httpx.get(server.url + "/metrics").text
    assert not leftovers(docker_cli, image[1])
