"""What the launcher itself costs: start-to-ready, teardown, and how fast the watchdog sees a dead server.

The server is the timing emulator (`dflash-bench emulate`), run as a local process and, when a Docker
daemon answers, in a container of a skeleton image with the host's Python mounted read-only (as the tests
do). Times are wall clock, median and max over --repeat launches.

    python -m benchmarks.harness.launch_overhead --repeat 5
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.fixtures.docker_image import host_python_mounts, skeleton_tar

from dflash_bench.launch import DockerOptions, free_port, launch_command


def emulator(port: int) -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "emulate", "--mode", "ar", "--port", str(port)]


def one(runner: str, opts: DockerOptions | None) -> dict[str, float]:
    port = free_port()
    t0 = time.perf_counter()
    with launch_command(emulator(port), port=port, runner=runner, docker=opts) as server:
        ready = time.perf_counter() - t0
        t1 = time.perf_counter()
    teardown = time.perf_counter() - t1
    port = free_port()
    with launch_command(emulator(port), port=port, runner=runner, docker=opts) as server:
        if runner == "process":
            os.kill(server.info.pid, signal.SIGKILL)
        else:
            server.cli.containers.get(server.info.container_id).kill()
        t2 = time.perf_counter()
        server.died.wait(30)
        watchdog = time.perf_counter() - t2
    return {"start_to_ready_s": ready, "teardown_s": teardown, "watchdog_s": watchdog}


def docker_options() -> tuple[DockerOptions | None, str | None]:
    try:
        import docker

        cli = docker.from_env(timeout=20)
        cli.ping()
    except Exception as err:
        print(f"docker: skipped ({type(err).__name__})")
        return None, None
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory() as tmp:
        cli.api.import_image_from_file(str(skeleton_tar(Path(tmp) / "s.tar")), repository="dflash-bench-bench", tag=tag)
    image = f"dflash-bench-bench:{tag}"
    return DockerOptions(image=image, gpus=None, hf_cache=False, shm_size=None, pull=False, ulimits=False,
                         mounts=host_python_mounts()), image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    opts, image = docker_options()
    runners = [("process", None)] + ([("docker", opts)] if opts else [])
    try:
        print(f"{'runner':8} {'metric':18} {'median':>8} {'max':>8}")
        for runner, o in runners:
            rows = [one(runner, o) for _ in range(args.repeat)]
            for key in rows[0]:
                vals = [r[key] for r in rows]
                print(f"{runner:8} {key:18} {statistics.median(vals):8.3f} {max(vals):8.3f}")
    finally:
        if image:
            import docker

            docker.from_env().images.remove(image, force=True)


if __name__ == "__main__":
    main()
