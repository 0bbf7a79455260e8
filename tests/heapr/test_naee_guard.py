"""NAEE's exhaustive subset search is bounded: above `max_subsets` it switches to its greedy form and says so."""
import copy

from lit_iclr.core.moe import check_moe, tiny_model, unfuse_experts
from lit_iclr.heapr.calibrate import calibrate
from lit_iclr.heapr.prune import naee_prune

from .helpers import markov_batches


def test_greedy_above_the_subset_limit_and_same_choice_for_one_removal():
    model = tiny_model("qwen2_moe", num_experts=6)
    unfuse_experts(model)
    calib = calibrate(model, markov_batches(2, 2, 12, vocab=128), with_gradients=False, collect_inputs=True)
    exhaustive, greedy = copy.deepcopy(model), copy.deepcopy(model)
    said = []
    kept_ex = naee_prune(check_moe(exhaustive), calib, 1 / 6, log=said.append)  # C(6, 5) = 6 subsets: exhaustive
    assert said == []
    kept_gr = naee_prune(check_moe(greedy), calib, 1 / 6, max_subsets=5, log=said.append)
    assert len(said) == 2 and all("greedy" in s and "C(6, 5)" in s for s in said)
    assert kept_gr == kept_ex  # removing one expert: the greedy round is the exhaustive search
    said.clear()
    kept_two = naee_prune(check_moe(copy.deepcopy(model)), calib, 2 / 6, max_subsets=5, log=said.append)
    assert all(len(k) == 4 for k in kept_two) and len(said) == 2
