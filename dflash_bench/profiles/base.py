"""What every engine profile provides: the server command for AR and DFlash, readiness, acceptance source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Sequence

from dflash_bench.errors import UserError
from dflash_bench.geometry import geometry
from dflash_bench.model_shapes import pair_configs
from dflash_bench.models import ModelPair

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile

MODES = ("ar", "dflash", "eagle3")  # eagle3: an EAGLE-3 head instead of the DFlash drafter, beside it in a sweep
PRESETS = ("generic", "h100", "b300")
# Other GPU names map onto the preset of their generation.
PRESET_ALIASES = {"h200": "h100", "h20": "h100", "hopper": "h100", "b200": "b300", "gb200": "b300",
                  "gb300": "b300", "blackwell": "b300"}
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")


def flag_values(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The values an engine's command line gives any of `flags`, in order (`--flag value` or `--flag=value`; a flag
    last on the line gives ""): the engines' parsers take the last one."""
    values = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            values.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
    return values


def random_weights(engine_args: Iterable[str]) -> bool:
    """Do an engine's flags give it random weights of the model's shape (`--load-format dummy`, vLLM's and SGLang's;
    the last --load-format given, as the engines read it)?"""
    return flag_values(list(engine_args), ("--load-format",))[-1:] == ["dummy"]


def tensor_parallel(engine_args: Any) -> int | None:
    """The tensor-parallel size passed through to the engine (vLLM `--tensor-parallel-size`, SGLang `--tp-size`);
    the last one given wins, as in the engines' own argument parsers."""
    args = [str(a) for a in engine_args] if isinstance(engine_args, list) else []
    sizes = [int(v) for v in flag_values(args, TP_FLAGS) if v.isdigit() and int(v) > 0]
    return sizes[-1] if sizes else None


def python_module(module: str) -> tuple[bool, str]:
    """Is the engine's Python package importable here (for `--runner process`)?"""
    import importlib.util

    found = importlib.util.find_spec(module) is not None
    return found, "importable" if found else f"not installed (pip install '.[{module}]', or use docker)"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}: use ar, dflash or eagle3.")
    return mode


def check_preset(preset: str | None) -> str:
    name = (preset or "generic").lower()
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise UserError(f"unknown GPU preset {preset!r}: use one of {', '.join(PRESETS + tuple(PRESET_ALIASES))}.")
    return name


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine. The AR and DFlash commands differ only in the speculative flags."""

    name: ClassVar[str]
    image: ClassVar[str | None]  # default container image (None: no image, process runner only)
    ready_path: ClassVar[str] = "/health"
    # How tau is read (metrics/acceptance.py READERS): "vllm-metrics" | "builtin-metrics" | "sglang-meta" |
    # "llamacpp-metrics". It is also the acceptance_source written to each cell.
    acceptance: ClassVar[str]
    # How the engine's own counting differs from metrics/definitions.py's tau ("" where it counts as defined),
    # and where the client checks it (metrics/acceptance.py CLIENT_TAU): "chunks" when each stream chunk carries
    # one verify step's tokens, "timings" for llama.cpp's per-response draft counts, None where it cannot.
    tau_counting: ClassVar[str] = ""
    client_tau: ClassVar[str | None] = None
    metrics_path: ClassVar[str] = "/metrics"
    default_port: ClassVar[int] = 8000
    api: ClassVar[str] = "chat"  # the client API: OpenAI "chat" completions, or SGLang's native "generate"
    # Who renders the chat template: the "server" (chat API), or the "client" with the target's tokenizer
    # (SGLang's /generate takes templated text).
    chat_template: ClassVar[str] = "server"
    runner: ClassVar[str] = "docker"  # the default runner: "docker" (its image) or "process" (a local command)
    # (variable, value): the environment that makes the engine draw each token's experts of a mixture at random.
    # Random weights route every token to the same few experts (seen with vLLM's dummy weights on gpt-oss-120b's
    # shape), so a step reads a few experts where a trained router's balanced load reads most of them; None: the
    # engine has no switch
    routing_simulation: ClassVar[tuple[str, str] | None] = None
    needs_gpu: ClassVar[bool] = True  # False: it also serves on a CPU (`doctor` asks for a GPU only where True)
    # The share of each GPU the engine may fill with weights and KV cache (sweep/fit.py); None: the engine
    # is not sized from the plan (the emulator, llama.cpp).
    memory_fraction: ClassVar[float | None] = None
    # Of that share, what the engine keeps for activations, CUDA graphs and the sampler (vLLM's
    # --gpu-memory-utilization covers them; SGLang's --mem-fraction-static leaves them outside).
    reserved_gib: ClassVar[float] = 0.0
    local_module: ClassVar[str | None] = None  # the Python distribution a process runner starts, if any
    # A server per concurrency whose slots equal it (llama.cpp: --parallel N, -c N x the per-slot context the
    # cells need): the plan groups such an engine's cells by concurrency, one launch each (sweep/slots.py).
    slots_per_cell: ClassVar[bool] = False
    # The POST path that empties the server's prefix cache (client/server_cache.py). A sweep's cells send the
    # suite's first prompts at every concurrency, so on a server that keeps prompts cached a later cell would
    # find the earlier cells' prompts there and skip their prefill: the sweep empties it before each cell on a
    # server it launched (what a repeat of the cell on a fresh server would see). A path holding "{slot}" is POSTed
    # once for each slot that GET /slots lists (llama.cpp). None: the engine keeps nothing between requests, or
    # offers no way to empty what it keeps.
    cache_reset: ClassVar[str | None] = None
    # Flags a sweep's server is launched with so that cache_reset empties everything it keeps (llama.cpp: its
    # host-memory prompt cache off, and the slot actions enabled); before the user's --engine-arg, which wins.
    cache_reset_flags: ClassVar[tuple[str, ...]] = ()
    # Those of cache_reset_flags whose other values keep prompts that cache_reset leaves, and what they keep: a
    # user's --engine-arg giving one another value makes each cell say its cache was not emptied (`cache_left`).
    cache_reset_keeps: ClassVar[dict[str, str]] = {}
    # What the server's environment needs for it to serve cache_reset (vLLM: VLLM_SERVER_DEV_MODE=1). Only the
    # servers a sweep launches get it (`plan_server`'s cache_reset); `dflash-bench launch`'s do not: the route is
    # a benchmark's, not a served model's.
    cache_reset_env: ClassVar[tuple[tuple[str, str], ...]] = ()

    def cache_left(self, command: Sequence[str]) -> str | None:
        """Why emptying a server run as `command` through cache_reset leaves prompts cached: a flag of
        cache_reset_keeps whose last value there (the one the engine takes) is not the sweep's; None where none is."""
        ours = dict(zip(self.cache_reset_flags[::2], self.cache_reset_flags[1::2]))
        for flag, keeps in self.cache_reset_keeps.items():
            given = flag_values(command, (flag,))
            if given and given[-1] != ours[flag]:
                return f"the server runs with {flag} {given[-1]} (an --engine-arg over the sweep's {ours[flag]}): {keeps}"
        return None

    def image_for(self, preset: str) -> str | None:
        """The default image for a GPU preset (most engines ship one image for all)."""
        return self.image

    def serve_pair(self, pair: ModelPair, mode: str, convert: bool, preset: str = "generic") -> ModelPair:
        """The pair as the server loads it (llama.cpp: GGUF files). `convert` False only plans the paths
        (dry runs); True makes them."""
        return pair

    def weights(self, preset: str) -> str | None:
        """What the server loads where the profile converts the weights (llama.cpp: "GGUF f32"), for the record."""
        return None

    def slot_flags(self, pair: ModelPair, slots: tuple[int, int] | None) -> list[str]:
        """Flags for (slots, per-slot context) where `slots_per_cell` (None: the profile's default)."""
        return []

    def process_argv(self, argv: list[str]) -> list[str]:
        """The command as the process runner starts it (where the engine's executable is found)."""
        return list(argv)

    def tokenizer(self, pair: ModelPair) -> str | None:
        """The tokenizer the client renders prompts with (None: the server renders them)."""
        return pair.target if self.chat_template == "client" else None

    def request_api(self, pair: ModelPair, api: str | None) -> tuple[str, str | None]:
        """The API a cell's requests use and the tokenizer the client renders their prompts with (None: the server
        renders them): the engine's own, or, where the sweep asks for `completions` (`--api`), OpenAI completions
        of the target's chat template rendered by the client. api_refusal has refused it for an engine whose own
        API is not chat."""
        if api == "completions":
            return "completions", pair.target
        return self.api, self.tokenizer(pair)

    def api_refusal(self, api: str | None) -> str | None:
        """Why this engine's requests cannot be `api` (--api), in one sentence; None where they can."""
        if api is None or api == self.api or self.api == "chat":
            return None
        return (f"--api {api}: the {self.name} engine's requests use its own {self.api} API, whose answers carry "
                "what the sweep reads of it; leave --api out for it")

    def version_note(self, pair: ModelPair) -> str:
        """The engine build the pair's card needs ("" when a release does)."""
        return ""

    def refusal(self, pair: ModelPair, mode: str, version: str | None) -> str | None:
        """Why this engine, at `version` (None: unknown), cannot serve the pair in this mode, in one sentence;
        None when nothing known stops it. The sweep fails that server's cells with it before launch."""
        if mode == "eagle3" and type(self).eagle3_flags is EngineProfile.eagle3_flags:
            return f"the {self.name} engine has no EAGLE-3 server here: the eagle3 mode runs on vllm (or the emulator)"
        return None

    def failure(self, log_tail: str) -> str | None:
        """The one sentence for a server death whose cause the engine's log names, else None."""
        return None

    def caveat(self, pair: ModelPair, mode: str, version: str | None) -> str | None:
        """What this engine, at `version`, serves differently from the pair's own definition although it starts
        (one sentence), else None. The sweep prints it and keeps it in the manifest's notes."""
        return None

    def version(self, runner: str, image: str | None) -> str | None:
        """The engine's version where it is known before launch: the local package (process runner) or the
        image's version tag (docker), else None."""
        import re

        if runner == "process":
            module = self.local_module
            if not module:
                return None
            from importlib.metadata import PackageNotFoundError, version

            try:
                return version(module)
            except PackageNotFoundError:
                return None
        tag = (image or self.image or "").rpartition(":")[2]
        match = re.fullmatch(r"v?(\d+\.\d+(?:\.\d+)?)", tag)
        return match.group(1) if match else None

    def image_missing(self) -> str:
        """What `doctor` says when the default image is not on this machine."""
        return "not pulled (the first launch pulls it)"

    def local_install(self) -> tuple[bool, str] | None:
        """(found, detail) for `--runner process` on this machine; None when the profile has nothing to check."""
        return None

    def command(self, pair: ModelPair, mode: str, port: int, preset: str | None = "generic",
                extra_args: Sequence[str] = (), host: str | None = None,
                slots: tuple[int, int] | None = None, synthetic: SyntheticProfile | None = None) -> list[str]:
        """The full server command line (as a local process would run it); `slots`: (slots, per-slot context)
        for an engine whose slots follow the cell's concurrency; `synthetic`: the acceptance profile a DFlash
        server draws instead of verifying (dflash_bench/synthetic.py)."""
        mode, preset = check_mode(mode), check_preset(preset)
        argv = self.base_command(pair) + self.target_flags(pair, preset) + self.slot_flags(pair, slots)
        if mode == "ar":
            argv += self.ar_flags()
        elif mode == "eagle3":
            argv += self.eagle3_flags(pair, preset, synthetic)
        elif synthetic is None:
            argv += self.spec_flags(pair, preset)
        else:
            argv += self.synthetic_spec_flags(pair, preset, synthetic)
        argv += ["--port", str(port)] + (["--host", host] if host else [])
        return argv + self.harness_flags() + self.mode_args(mode, list(extra_args))

    def mode_args(self, mode: str, extra_args: list[str]) -> list[str]:
        """The sweep's --engine-arg flags as this mode's server takes them (all of them, unless the engine has
        flags that exist for one mode only)."""
        return extra_args

    def env(self, pair: ModelPair, mode: str) -> dict[str, str]:
        """Environment variables the card asks for (the same for AR and DFlash)."""
        return {}

    def verify_budget(self, pair: ModelPair, mode: str, argv: Sequence[str]) -> tuple[int, int, int] | None:
        """A speculative server's tokens a step, from its full command line: (the token budget, the part of it the
        engine sets aside for drafting, the tokens a row's verify takes); None where the engine takes no such budget
        from its flags."""
        return None

    def sampler_reserve(self, pair: ModelPair, mode: str, argv: Sequence[str]) -> int:
        """Bytes of each GPU a server run as `argv` holds in its sampler beyond what its own memory profile counts
        (and so gives its KV cache): the memory fraction it is launched with leaves them out (sweep/fit.py)."""
        return 0

    def random_weights_env(self, pair: ModelPair) -> dict[str, str]:
        """Environment variables a server of random weights (`random_weights`) needs for its time to be a trained
        model's (the same for AR and DFlash): a mixture's experts drawn at random (`routing_simulation`)."""
        if self.routing_simulation is None:
            return {}
        shape = geometry(pair_configs(pair)[0])
        return dict([self.routing_simulation]) if shape and shape.experts else {}

    def routes_at_random(self, env_names: Iterable[str]) -> bool:
        """Did a server with these environment variables (a manifest's `env_names`) draw a mixture's experts at
        random?"""
        return self.routing_simulation is not None and self.routing_simulation[0] in set(env_names)

    def container_command(self, argv: list[str]) -> list[str]:
        """The part of `argv` that follows the image name in `docker run` (the image's entrypoint runs it)."""
        return list(argv)

    # Engine-specific parts.
    def base_command(self, pair: ModelPair) -> list[str]:
        raise NotImplementedError

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        raise NotImplementedError

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        raise NotImplementedError

    def synthetic_refusal(self, extra_args: Sequence[str] = ()) -> str | None:
        """Why this engine cannot draw a synthetic acceptance profile with these --engine-args (one sentence, the
        sweep refuses it before launch), or None where it can."""
        return (f"the {self.name} engine has no synthetic acceptance (a drawn acceptance profile instead of "
                f"verifying): measure it without --synthetic-acceptance, in a sweep of its own")

    def synthetic_spec_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile) -> list[str]:
        """The DFlash server's speculative flags when it draws `synthetic` instead of verifying."""
        raise UserError(self.synthetic_refusal() or f"the {self.name} engine has no synthetic acceptance")

    def eagle3_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile | None = None) -> list[str]:
        """The speculative flags of an EAGLE-3 server (the eagle3 mode): vLLM's, and the emulator's stand-in;
        `synthetic`: the acceptance it draws, at the same tau over its own draft length (synthetic.for_draft)."""
        raise UserError(f"the {self.name} engine has no EAGLE-3 server here: the eagle3 mode runs on vllm "
                        "(or the emulator)")

    def ar_flags(self) -> list[str]:
        """Flags only the AR server gets (none for vLLM and SGLang: AR is the command minus spec flags)."""
        return []

    def sizing_flags(self, context_len: int | None, max_concurrency: int, tensor_parallel: int | None,
                     memory_fraction: float | None = None) -> list[str]:
        """Flags that size the server for the plan (sweep/fit.py): its context limit (None: not derived, the
        GPU's memory is unknown), memory fraction (`memory_fraction` where given, else the profile's), most
        requests at once, tensor-parallel size."""
        if tensor_parallel and tensor_parallel > 1:
            raise UserError(f"--tensor-parallel-size {tensor_parallel}: the {self.name} engine runs on one GPU; "
                            f"tensor parallelism is for vllm and sglang.")
        return []

    def harness_flags(self) -> list[str]:
        """Flags the harness needs in both modes (metrics on, ...)."""
        return []
