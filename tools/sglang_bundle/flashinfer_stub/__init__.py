"""Stand-in for FlashInfer, which the offline SGLang bundle leaves out (tools/sglang_bundle/README.md).

On CUDA, SGLang 0.5.16 imports two FlashInfer modules unconditionally: flashinfer.sampling
(sglang/srt/layers/sampler.py, line 31) and flashinfer.prefill (sglang/srt/layers/attention/vision.py,
line 47). These stand-ins satisfy those imports and nothing more; any other flashinfer import still
fails with ImportError, so SGLang's own fallbacks apply. Their functions raise if called: run SGLang with
--attention-backend triton --sampling-backend pytorch and SGLANG_IS_FLASHINFER_AVAILABLE=false
(setup.sh sets it), and none is called.
"""
__version__ = "0.0.0+sglang-bundle-stub"


def _missing(name):
    def f(*args, **kwargs):
        raise RuntimeError(f"flashinfer.{name}: FlashInfer is not in the offline SGLang bundle; "
                           "run SGLang with --attention-backend triton --sampling-backend pytorch")
    f.__name__ = name.rsplit(".", 1)[-1]
    return f
