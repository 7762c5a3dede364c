"""train/policy_lag_*: mean, max and the per-lag sample counts (issue 26's policy-lag histogram)."""

from types import SimpleNamespace

from spade.run.step_metrics import policy_lag


def test_histogram_counts_samples_per_lag():
    samples = [SimpleNamespace(weight_version=v) for v in (5, 5, 4, 2, None)]
    # updating version 5: lags 0, 0, 1, 3 (the sample without a version is left out)
    assert policy_lag(samples, 5) == {
        "train/policy_lag_mean": 1.0, "train/policy_lag_max": 3.0,
        "train/policy_lag_count/0": 2.0, "train/policy_lag_count/1": 1.0, "train/policy_lag_count/3": 1.0}


def test_no_versions_no_metrics():
    assert policy_lag([SimpleNamespace(weight_version=None)], 3) == {}
