"""The ranks of a load together: the world, its devices and node names (:mod:`.world`), the two
collectives (:mod:`.exchange`), the handshake that proves every rank loads the same thing the same
way (:mod:`.agreement`), where the replicas stand (:mod:`.placement`) and who of them reads what
(:mod:`.replica_split`), the wire their windows travel on (:mod:`.wire`), and torch's private APIs
with their fallbacks (:mod:`.torch_private`). This face imports nothing."""
