"""Does DFlash still produce the target's own output? Token-level lossless check and task accuracy.

- lossless.py   AR vs DFlash token ids at temperature 0: identical or not, first divergence, its margin
- scoring.py    answer checkers: GSM8K, Math500 (math-verify), HumanEval / MBPP program assembly
- intervals.py  Wilson interval and the paired (Newcombe) interval of a difference of proportions
- sandbox.py    runs model-written code in its own process: limits, no network, no writes outside its folder
- accuracy.py   scores the cells of a sweep folder, AR and DFlash on the same prompts
"""
