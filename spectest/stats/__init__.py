"""spectest's statistics engine: numpy / scipy / statsmodels / pandas only (never torch).

Entry point: ``analyze(samples, reference=..., candidate=..., options=AnalysisOptions(...))``
→ ``Analysis``: one ``FamilyResult`` per registered test family (``analyze.FAMILIES``; the
contract in ``families``, one module per family: ``family_cells``, ``family_trie``,
``family_whitebox``, ``family_sequence``, ``family_lengths``; the options in ``options``).
The building blocks live one concern per module: ``histograms`` (encoding,
tidy counts), ``tables`` (many 2-arm tables + sequence relabelings), ``homogeneity`` (pooled
χ², GOF χ²), ``multiplicity`` (BH/BY/Holm, max-T), ``distance`` (TV and its null), ``trie``
(prefix-conditional χ², chain-rule G²), ``whitebox`` (PIT, directed z, acceptance, support),
``power`` (MDE, seeds needed).
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
