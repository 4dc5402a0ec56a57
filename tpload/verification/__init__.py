"""The gate: everything that judges whether a served byte is the checkpoint's, in one folder.

It reads no stored byte and imports nothing of the load: what it needs of the load is typed by
Protocols of its own (strategy.py), and the evidence it judges is produced by the read sources
(sources/hashing.py: the hash taps and tensors read whole at rest; sources/whole_files.py: files
hashed whole beside the copies). Read in this order:

* :mod:`.gate` -- the strategies (one a verify mode and anchor), the verdict, the checks at rest;
* :mod:`.strategy` -- what a strategy needs of the load (the Protocols), and its three steps;
* :mod:`.whole_files` -- the strategies of folders vouched for file by file;
* :mod:`.node` -- who hashes what (each tensor once per node), and node mode's cross-check;
* :mod:`.hashes` -- the content hash (sha256, or blake3), and what the hashing found, judged;
* :mod:`.evidence` -- what each served tensor leaves behind, and the settlement that judges it
  (every problem of a rank listed at once);
* :mod:`.digest` -- a rank's digest of what it serves;
* :mod:`.store` -- trusted digests for ``--verify digest`` and the blake3 sidecar, kept by the
  operator, not the checkpoint;
* :mod:`.signing` -- model.sig, checked before the storage opens;
* :mod:`.terms` -- what every rank must agree on, and the verdict's check that the rows agree;
* :mod:`.trust` -- what vouched, as a record;
* :mod:`.vouched` -- the capability offline writers take.

What each mode proves, and against whom, is in docs/threat-model.md.
"""
