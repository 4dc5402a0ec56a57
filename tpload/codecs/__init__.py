"""Stored formats: one small module per format, each saying how its tensors are packed, cut and
decoded (the abstract base they implement, and the types and window arithmetic they share:
base.py; the codec a config role names: registry.py). This face imports nothing.

A codec answers, for one weight (and its scale, if the format has one):

* :meth:`Codec.fit` -- does this stored tensor (dtype, shape) fit the format, and with
  which scale group (elements per scale entry, along rows and columns)?
* :meth:`Codec.window` -- the weight's and the scale's cuts for one tensor-parallel
  rank, derived once from a channel window and the packing;
* :meth:`Codec.served` -- what a rank serves (stored bytes, or a bf16 decode);
* :meth:`Codec.checker` -- the value checks on the host bytes as they stream by
  (bad scale bytes, NaN codes, decodes that would overflow bf16);
* :meth:`Codec.decode` -- the decode into a slot: the compiled kernel when the
  inputs are host arrays, torch ops on a device; :meth:`Codec.reference` is the
  other of the two, an independent check of the first.

Adding a format is one new module here plus a config rule naming its role.
"""
