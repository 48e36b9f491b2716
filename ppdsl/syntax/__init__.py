"""Text to IR: the Lark grammar, the token scanner, and the .pps printer and formatter."""
