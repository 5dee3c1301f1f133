"""The docs' and the README's code blocks, run as a reader would."""
