"""spectest's statistics engine: numpy / scipy / statsmodels / pandas only (never torch).

Entry point: ``analyze(samples, reference=..., candidate=..., options=AnalysisOptions(...))``
→ ``Analysis``, one ``FamilyResult`` per registered family (``battery.FAMILIES``). Each
module's concern: docs/architecture.md ("Statistics").
"""

from spectest.stats.battery import Analysis, AnalysisOptions, analyze
from spectest.stats.histograms import position_counts, trie_counts
from spectest.stats.homogeneity import HomogeneityResult, gof_chi2, pooled_chi2
from spectest.stats.multiplicity import MultiplicityResult, adjust, maxt_adjust
from spectest.stats.power import directed_z_mde, lambda_star, mde_tv, seeds_for_tv

__all__ = [
    "Analysis",
    "AnalysisOptions",
    "HomogeneityResult",
    "MultiplicityResult",
    "adjust",
    "analyze",
    "directed_z_mde",
    "gof_chi2",
    "lambda_star",
    "maxt_adjust",
    "mde_tv",
    "pooled_chi2",
    "position_counts",
    "seeds_for_tv",
    "trie_counts",
]
