"""Everything a load is asked to do: the options (:mod:`.load_options`, one dataclass that drives
``load()``, the flags and README's table), the rules across options and on the paths they name
(:mod:`.rules`) and the command-line flags generated from them (:mod:`.flags`). This face imports
nothing."""
