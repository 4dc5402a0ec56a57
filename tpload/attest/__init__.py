"""What builds on a passed verdict: the load attestation, built (:mod:`.build`), checked
(:mod:`.check`) and signed (:mod:`.signing`), and the offline predictions of each rank's digest,
made by running the loop on the CPU (:mod:`.predict`). This face imports nothing."""
