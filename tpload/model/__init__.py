"""The data floor: what every layer above shares and nothing here reads a file.

The errors (:mod:`.errors`), text that reaches a terminal (:mod:`.text`), the named modes
(:mod:`.modes`), the kinds of numbers and their ranges (:mod:`.bounds`), tables held as columns
(:mod:`.columns`), the value types several layers exchange (:mod:`.values`), a stored tensor as a
header names it (:mod:`.meta`), the trust source a verdict names (:mod:`.trust`) and natural order
(:mod:`.templates`). It imports nothing of tpload above it.
"""
