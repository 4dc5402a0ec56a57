"""Which rules and codecs a checkpoint gets: the TOML rules (:mod:`.config`, over the shipped
configs in tpload/configs/), the layers' name prefix (:mod:`.prefix`), the KV-cache scale census
(:mod:`.kvscales`) and the default names (:mod:`.defaults`). The config a checkpoint's config.json
names is read and picked above, where files are opened (loading/pick.py). This face imports
nothing."""
