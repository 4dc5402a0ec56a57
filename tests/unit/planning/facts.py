"""Everything a classification gives, as one comparable tuple: the classification tests pin its
digest."""

from __future__ import annotations

import numpy as np

from tpload.planning.classify import Classified


def classified_facts(c: Classified) -> tuple:
    e = c.entries
    return (
        e.names,
        e.klass.tolist(),
        e.scales,
        e.scales2,
        e.expert_set.tolist(),
        e.expert_index.tolist(),
        e.set_names,
        [(k.rule, k.codec, k.fit, k.stacked_experts) for k in e.classes],
        c.skipped,
        c.deferred,
        c.deferred_experts,
        c.expert_counts,
        c.expert_at.tolist(),
        np.asarray(c.deferred_at).tolist(),
    )
