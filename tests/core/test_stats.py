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
