"""The paired confidence interval against scipy's paired t-test."""
import numpy as np
import pytest
from scipy import stats

from lit_iclr.core.stats import mean_std, paired_ci


def test_paired_ci_matches_scipy_ttest_rel():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 7)
    b = a - rng.normal(0.5, 0.1, 7)
    ci = paired_ci(a, b)
    ref = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert np.isclose(ci.low, ref.low) and np.isclose(ci.high, ref.high) and np.isclose(ci.mean, (a - b).mean())
    assert ci.significant and "not significant" not in str(ci)


def test_paired_ci_says_not_significant_and_refuses_unpaired():
    ci = paired_ci([1.0, 2.0, 3.0], [1.1, 1.9, 3.05])
    assert not ci.significant and str(ci).endswith("not significant")
    with pytest.raises(ValueError, match="equal length"):
        paired_ci([1.0, 2.0], [1.0])


def test_mean_std_uses_the_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == "2 +- 1"


def test_ratio_ci_is_the_t_interval_of_the_per_pair_ratios():
    import numpy as np
    from scipy import stats

    from lit_iclr.core.stats import ratio_ci

    a, b = [10.0, 12.0, 11.0, 13.0], [10.0, 10.0, 10.0, 10.0]
    r = np.array(a) / np.array(b)
    half = stats.t.ppf(0.975, 3) * r.std(ddof=1) / 2
    assert ratio_ci(a, b) == f"{r.mean():.3f} [{r.mean() - half:.3f}, {r.mean() + half:.3f}]"


def test_finite_only_drops_the_pairs_with_a_missing_value():
    a, b = [1.0, 2.0, float("nan"), 4.0, 5.0], [0.0, 1.5, 1.0, float("inf"), 3.0]
    ci = paired_ci(a, b, finite_only=True)
    kept = paired_ci([1.0, 2.0, 5.0], [0.0, 1.5, 3.0])
    assert ci.n == 3 and (ci.mean, ci.low, ci.high) == (kept.mean, kept.low, kept.high)
    assert np.isnan(paired_ci(a, b).mean)  # without it the missing value poisons the mean
