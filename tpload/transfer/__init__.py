"""Moving window bytes from a staging buffer to the device, one file per device kind.

A transfer takes each block the reader yields and puts it where it is served
(a slot of the rank's arena) or where the decoder reads it, fingerprinting the
host bytes in the same pass, and says how the served bytes are proven to be
those host bytes:

* :mod:`.cpu`: the fused copy writes the slot and fingerprints what it wrote;
  the decoder reads the staging buffer in place.
* :mod:`.cuda`: the fused copy writes a pinned buffer, a non-blocking copy on a
  side stream sends it to the device, and the device fingerprint of the slot
  must equal the host window's.

What every transfer is: base.py; the one a device gets: device.py. This face imports nothing.
"""
