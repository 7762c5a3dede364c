"""spade.deferred_imports: loading a transformers causal-LM class no longer imports scikit-learn;
transformers' ``roc_curve`` imports it on first call and returns scikit-learn's own result.

The probe runs in a fresh interpreter: an xdist worker may have imported scikit-learn already, and
then nothing is deferred."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

LABELS = [0, 1, 1, 0, 1, 0]
SCORES = [0.1, 0.8, 0.6, 0.3, 0.35, 0.7]

PROBE = r"""
import json, sys
import spade
from transformers import AutoModelForCausalLM
from transformers.generation import candidate_generator
from transformers.utils import is_sklearn_available
before = sorted(name for name in ("sklearn", "sklearn.metrics", "scipy.stats") if name in sys.modules)
fpr, tpr, thresholds = candidate_generator.roc_curve(%(labels)r, %(scores)r)
import sklearn.metrics
print(json.dumps({
    "imported_before_call": before,
    "sklearn_available_to_transformers": is_sklearn_available(),
    "roc_curve": [fpr.tolist(), tpr.tolist(), [float(t) for t in thresholds]],
    "metrics_is_the_real_module": hasattr(sklearn.metrics, "roc_auc_score"),
    "auc": sklearn.metrics.roc_auc_score(%(labels)r, %(scores)r),
}))
""" % {"labels": LABELS, "scores": SCORES}


def test_a_causal_lm_import_defers_scikit_learn_until_roc_curve_is_called():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["imported_before_call"] == []
    assert seen["sklearn_available_to_transformers"] is True  # transformers' behaviour is unchanged
    fpr, tpr, thresholds = roc_curve(LABELS, SCORES)  # scikit-learn's, in this process
    got_fpr, got_tpr, got_thresholds = (np.array(values) for values in seen["roc_curve"])
    assert np.array_equal(got_fpr, fpr) and np.array_equal(got_tpr, tpr)
    assert np.array_equal(got_thresholds, thresholds)
    assert seen["metrics_is_the_real_module"] is True
    assert seen["auc"] == roc_auc_score(LABELS, SCORES)
