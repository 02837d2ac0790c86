"""Prints what a hostile or careless script can print: a terminal title (OSC), a C1
control sequence introducer, a NUL, colours, and a clear-screen."""

import dmlctl

dmlctl.init()
print("title \x1b]0;owned\x07 c1 \x9b2J nul \x00 end", flush=True)
print("\x1b[31mred\x1b[0m and \x1b[2J clear", flush=True)
