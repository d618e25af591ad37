"""Stand-in for flashinfer.sampling (see __init__.py): imported by sglang/srt/layers/sampler.py."""
from flashinfer import _missing

min_p_sampling_from_probs = _missing("sampling.min_p_sampling_from_probs")
top_k_top_p_sampling_from_probs = _missing("sampling.top_k_top_p_sampling_from_probs")
