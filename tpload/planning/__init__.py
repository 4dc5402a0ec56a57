"""The planner's parts, each one job: the layout's arithmetic (layout.py), the readers of each
stored window (reads.py), classification of a catalogue under a config (classify.py), the windows
of one class of tensors on one rank (cutting.py) and the checks and suggestions of a layout
(checks.py). ``tpload.plan`` puts them together into rank plans."""
