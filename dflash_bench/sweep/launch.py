"""The launch phase: the servers of one group up (one launch, or with --paired an engine's AR and DFlash
servers together), the cells they serve handed out while each server is alive, every server torn down.

A server that does not start fails its own cells; one that dies is relaunched once, then fails its later ones;
one whose identity changes (another server answers) fails the cell (`Servers.alive`, launch/identity.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

from dflash_bench.errors import UserError
from dflash_bench.launch.common import free_port
from dflash_bench.launch.identity import IdentityChanged, changed, expect, verify_external
from dflash_bench.launch.watchdog import Relaunching
from dflash_bench.models import ModelPair
from dflash_bench.store import CellPlan, Manifest, ServerRecord, SweepSettings
from dflash_bench.sweep.context import SweepContext, reason
from dflash_bench.sweep.plan import Launch
from dflash_bench.sweep.slots import launch_slots
from dflash_bench.sweep.write import fail_cell


DYING_POLLS = 30  # 0.1 s apart: how long a launched server that stopped answering is given to show its exit


@dataclass
class Server:
    """A server cells are measured on: launched by the sweep, or the user's own URL."""

    url: str
    # raises UserError once the server has died (launch.Server.check), IdentityChanged once another answers
    check: Callable[[], None]
    info: ServerRecord

    @property
    def identity(self) -> str | None:
        """What was checked that this server is the one launched (CellSummary.server_identity)."""
        return self.info.identity.summary() if self.info.identity else None


@dataclass
class Servers:
    """The servers of one group that started, by mode, and the group's cells in plan order."""

    ctx: SweepContext
    cells: list[CellPlan]
    by_mode: dict[str, Server]
    slots: dict[str, Relaunching[Server]] = field(default_factory=dict)

    def alive(self) -> Iterator[tuple[CellPlan, Server]]:
        """Each cell whose server started, with that server, while it is alive. A server found dead (the cell
        it died under is already recorded failed) is relaunched once and its later cells run on the new one;
        after that, or when another server answers in its place, the cell fails with the reason."""
        for cell in [c for c in self.cells if c.mode in self.by_mode]:
            server = self.by_mode[cell.mode]
            try:
                server.check()
            except IdentityChanged as err:
                fail_cell(self.ctx, cell, err.failure)
                continue
            except UserError as err:
                revived = self._relaunch(cell, err)
                if revived is None:
                    continue
                server = revived
            yield cell, server

    def _relaunch(self, cell: CellPlan, died: UserError) -> Server | None:
        why = reason(died, cell.engine)
        slot = self.slots.get(cell.mode)
        try:
            server = slot.relaunch() if slot is not None else None
        except UserError as err:
            fail_cell(self.ctx, cell, f"server died ({why}) and its relaunch did not start: {reason(err, cell.engine)}")
            return None
        if server is None:
            fail_cell(self.ctx, cell, f"server died: {why}")
            return None
        key = f"{cell.engine}-{cell.mode}"
        self.by_mode[cell.mode] = server
        record_server(self.ctx.manifest, key, server.info)
        self.ctx.manifest.notes.append(f"{key}: relaunched before {cell.cell_id} after it died ({why}); the cells "
                                       "from there on ran on the new server")
        self.ctx.sweep.write_manifest(self.ctx.manifest)
        return server


@contextlib.contextmanager
def servers_up(ctx: SweepContext, group: list[Launch]) -> Iterator[Servers]:
    """The group's servers, started in order, and always torn down. Each listens on a free port unless --port names
    one (paired, the group's first server's: those beside it take free ones), so that a sweep never fails because
    another program holds an engine's default port.

    A UserError as the servers go down fails what is left of the group's cells."""
    mine = {id(c) for launch in group for c in launch.cells}
    cells = [c for c in ctx.manifest.plan if id(c) in mine]
    handed_out = body_failed = False
    try:
        with contextlib.ExitStack() as stack:
            up: dict[str, Server] = {}
            slots: dict[str, Relaunching[Server]] = {}
            for i, launch in enumerate(group):
                port = ctx.settings.port if ctx.settings.port and i == 0 else free_port()
                try:
                    refused(ctx, launch)
                    slots[launch.mode] = slot = Relaunching(partial(_server, ctx, launch, port))
                    stack.callback(slot.close)
                    up[launch.mode] = slot.start()
                except UserError as err:
                    for cell in launch.cells:
                        fail_cell(ctx, cell, f"server did not start: {reason(err, launch.engine)}")
                    continue
                info = up[launch.mode].info
                record_server(ctx.manifest, f"{launch.engine}-{launch.mode}", info)
                if info.ready_s is not None:
                    print(f"{launch.engine}-{launch.mode} server ready after {info.ready_s:.0f} s", flush=True)
                check_same_image(ctx.manifest, launch.engine)
            ctx.sweep.write_manifest(ctx.manifest)
            handed_out = True
            try:
                yield Servers(ctx, cells, up, slots)
            except BaseException:
                body_failed = True  # the caller's own error (a cell that cannot be written, say): never a launch's
                raise
    except UserError as err:  # as the servers went down: what is left of these launches fails
        if body_failed:
            raise
        for cell in cells:
            if cell.status not in ("complete", "partial", "failed"):
                fail_cell(ctx, cell, f"server did not start: {reason(err, cell.engine)}")
        if not handed_out:
            yield Servers(ctx, [], {})


@contextlib.contextmanager
def _server(ctx: SweepContext, launch: Launch, port: int) -> Iterator[Server]:
    """A running server for this launch: launched by us on `port`, or the user's own URL."""
    settings = ctx.settings
    if settings.url_ar:
        url = (settings.url_ar if launch.mode == "ar" else settings.url_dflash) or ""  # plan: both or neither
        info = ServerRecord(runner="external", url=url, identity=verify_external(url, settings.expect_model))
        yield Server(url=url, check=partial(_same, info, lambda: None), info=info)
        return
    from dflash_bench import profiles
    from dflash_bench.launch import launch_server
    from dflash_bench.sweep.fit import server_args
    from dflash_bench.telemetry import scheduler_gpus

    runner = settings.runner
    gpus = (scheduler_gpus() or "all") if runner == "docker" else "all"  # a container escapes a Slurm job's GPUs
    with launch_server(launch.engine, ctx.pair, launch.mode, runner=runner, preset=settings.gpu, gpus=gpus,
                       extra_args=server_args(settings, launch.engine, ctx.pair, launch.mode),
                       sweep_id=ctx.manifest.sweep_id, image=ctx.image,
                       log_path=ctx.sweep.log_path(launch.engine, launch.mode),
                       port=port, slots=launch_slots(ctx, launch),
                       synthetic=launch.synthetic if launch.mode != "ar" else None, cache_reset=True) as server:
        gpus_used = profiles.server_gpus(launch.engine, ctx.pair, settings)
        info = server.info.model_copy(update={"gpus": gpus_used})
        if info.identity is not None and settings.expect_model:
            expect(info.identity, server.url, settings.expect_model)
        yield Server(url=server.url, check=partial(_same, info, server.check), info=info)


def _same(info: ServerRecord, alive: Callable[[], None]) -> None:
    """The server is alive (ServerDied otherwise) and still the one recorded (IdentityChanged otherwise)."""
    alive()
    why = changed(info.identity, info.url) if info.identity is not None else None
    if why and info.runner != "external":  # a launched server that stopped answering may be exiting: then its
        for _ in range(DYING_POLLS):       # death, with its log's reason, is what the cell keeps (and relaunches)
            time.sleep(0.1)
            alive()
    if why:
        raise IdentityChanged(why)


def refused(ctx: SweepContext, launch: Launch) -> None:
    """Refuse, before launch, a server the engine's known version cannot run (profiles' `refusal`); note what it
    serves differently where it starts (profiles' `caveat`), and a speculative server whose token budget makes the
    rows of a cell wait a step (fit.verify_budget)."""
    from dflash_bench import profiles

    if ctx.settings.url_ar:
        return
    profile = profiles.get(launch.engine)
    version = profile.version(ctx.settings.runner, ctx.image)
    why = profile.refusal(ctx.pair, launch.mode, version)
    if why:
        raise UserError(why)
    for note in launch_notes(ctx.settings, ctx.pair, launch.engine, launch.mode, version):
        if f"{launch.engine}: {note}" not in ctx.manifest.notes:
            ctx.manifest.notes.append(f"{launch.engine}: {note}")
            print(f"note: {launch.engine}: {note}", flush=True)


def launch_notes(settings: SweepSettings, pair: ModelPair, engine: str, mode: str, version: str | None) -> list[str]:
    """What a server the engine will start serves differently (profiles' `caveat`), and for a speculative one a token
    budget that makes a cell's rows wait a step (fit.verify_budget) and the memory its sampler holds back
    (fit.sampler_note): said at launch and by a dry run alike."""
    from dflash_bench import profiles
    from dflash_bench.store import SPECULATIVE
    from dflash_bench.sweep.fit import sampler_note, verify_budget

    notes = [profiles.get(engine).caveat(pair, mode, version)]
    if mode in SPECULATIVE:
        notes += [verify_budget(settings, pair, engine, mode)[1], sampler_note(settings, pair, engine, mode)]
    return [n for n in notes if n]


def record_server(manifest: Manifest, key: str, info: ServerRecord) -> None:
    """The first server of each (engine, mode) keeps its key; later ones (a resume, a relaunch) are added
    beside it as `<key> #2`, `#3`, ..., so the record of what measured the first cells is never lost."""
    if key not in manifest.servers:
        manifest.servers[key] = info
        return
    n = 2
    while f"{key} #{n}" in manifest.servers:
        n += 1
    manifest.servers[f"{key} #{n}"] = info


def check_same_image(manifest: Manifest, engine: str) -> None:
    """AR and DFlash must run the same image: a digest that changed between them (a re-pulled tag) is noted."""
    digests = {mode: getattr(manifest.servers.get(f"{engine}-{mode}"), "image_digest", None) for mode in ("ar", "dflash")}
    if all(digests.values()) and digests["ar"] != digests["dflash"]:
        note = f"{engine}: the AR and DFlash servers ran different image digests ({digests['ar']} vs {digests['dflash']})"
        if note not in manifest.notes:
            manifest.notes.append(note)
