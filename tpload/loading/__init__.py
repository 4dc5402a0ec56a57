"""One rank's load: the fixed sequence of a call (:mod:`.sequence`) and its steps (:mod:`.steps`),
the config a checkpoint's config.json names (:mod:`.pick`) and its planner (:mod:`.planner`), the
copy loop (:mod:`.loop`) with its batches of small tensors (:mod:`.batch`), what the loop leaves
(:mod:`.result`), the out-of-memory pre-flight (:mod:`.preflight`), deferred tensors' locators
(:mod:`.deferred`), what a passed load returns (:mod:`.shards`) and giving memory back
(:mod:`.teardown`). This face imports nothing."""
