"""The tiny pair's recipe: train, measure, check it against z-lab's code (run as `python -m recipes.tiny_pair.<name>`)."""
