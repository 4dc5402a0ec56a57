"""Pure arithmetic from the catalogue and the config: no file is read here. The planner's parts,
each one job: the layout's arithmetic (layout.py), classification of a catalogue under a config
(classify.py, with the classified weights as columns: entries.py), the windows of one class of
tensors on one rank (cutting.py), a plan's named items (items.py) and the checks and suggestions of
a layout (checks.py). planner.py puts them together into rank plans, and batches.py says which
items of a plan load as one batch. This face imports nothing."""
