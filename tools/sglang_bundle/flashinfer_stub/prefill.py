"""Stand-in for flashinfer.prefill (see __init__.py): imported by sglang/srt/layers/attention/vision.py."""
from flashinfer import _missing

cudnn_batch_prefill_with_kv_cache = _missing("prefill.cudnn_batch_prefill_with_kv_cache")
