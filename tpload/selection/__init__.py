"""Which rules and codecs a checkpoint gets: the config named or detected from its config.json
(:mod:`.pick`), the TOML rules (:mod:`.config`, over the shipped configs in tpload/configs/), the
layers' name prefix (:mod:`.prefix`), the KV-cache scale census (:mod:`.kvscales`) and the default
names (:mod:`.defaults`). This face imports nothing."""
