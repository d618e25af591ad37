"""The reference engine: the plain PyTorch DFlash step that matches z-lab's code, and the definitions the fast path builds on."""
