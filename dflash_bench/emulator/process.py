"""`EmulatorProcess`: an emulator in a child process, started through the CLI (`dflash-bench emulate`)."""

from __future__ import annotations

import subprocess
import sys
import tempfile


class EmulatorProcess:
    """An emulator in a child process (for tests, benchmarks and the sweep's own checks).

        with EmulatorProcess(mode="dflash", itl_ms=5) as em:
            ... em.url ...

    It listens on a free port of 127.0.0.1 and is killed on exit from the block (or by `close`)."""

    def __init__(self, **options: object):
        args = [sys.executable, "-m", "dflash_bench", "emulate"]
        for k, v in options.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                args.append(flag)
            elif v is not False and v is not None:
                args += [flag, str(v)]
        args += ["--port", "0"]
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: a long run must never block on stderr
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._err, text=True)
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self._err.seek(0)
            err = self._err.read().decode(errors="replace")[-2000:]
            self.close()
            raise RuntimeError(f"emulator did not start: {line.strip()} {err.strip()}")
        self.url = line.rsplit(" ", 1)[1].strip()

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()
        return self.proc.returncode

    def __enter__(self) -> "EmulatorProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
