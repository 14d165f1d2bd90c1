"""Direct Preference Optimization's numbers on the host: the loss, reward accuracy and margins a
run logs and `tinygpt eval` reports of preference pairs (the device's loss and gradient:
shaders/preference.wgsl), from each completion's log-probability under the policy and the
reference. Windows come in pairs: 2i the chosen completion, 2i+1 the rejected one.
"""
from __future__ import annotations

import numpy as np

DPO_BETA = 0.1                  # trl's default: how far the policy may move from the reference


def preference_stats(policy: np.ndarray, reference: np.ndarray, beta: float) -> dict:
    """DPO's loss, reward accuracy and margins over pairs, from each window's log-probability under
    the policy and the reference (windows 2i chosen, 2i+1 rejected), as trl reports them: a
    completion's reward is beta (log pi - log pi_ref)."""
    reward = beta * (np.asarray(policy, np.float64) - np.asarray(reference, np.float64))
    chosen, rejected = reward[0::2], reward[1::2]
    margin = chosen - rejected
    return {"loss": float(np.logaddexp(0.0, -margin).mean()), "reward_accuracy": float((margin > 0).mean()),
            "reward_margin": float(margin.mean()), "chosen_reward": float(chosen.mean()),
            "rejected_reward": float(rejected.mean()), "pairs": int(len(margin))}
