"""The HF backend: sampled log-probs equal a fresh forward pass; stop strings; bucketing keeps order."""

import torch

from helpers import tiny_policy


def test_sampled_logprobs_equal_fresh_forward(base_model_dir):
    policy = tiny_policy(base_model_dir, batch_size=3)
    prompts = ["short", "a somewhat longer prompt with more words in it", "mid length prompt", "x " * 40]
    gens = policy.generate(prompts, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=0)
    assert [len(g.token_ids) for g in gens] == [len(g.logprobs) for g in gens]
    assert all(len(g.token_ids) >= 1 for g in gens)
    scored = policy.token_logprobs(prompts, [g.token_ids for g in gens])
    for g, lp in zip(gens, scored):
        assert lp.shape == (len(g.token_ids),)
        torch.testing.assert_close(torch.tensor(g.logprobs), lp, atol=2e-4, rtol=0)
        assert (lp <= 0).all()


def test_generation_is_seeded_and_greedy_is_deterministic(base_model_dir):
    policy = tiny_policy(base_model_dir)
    prompts = ["one", "two two", "three three three"]
    a = policy.generate(prompts, temperature=1.0, max_new_tokens=8, seed=5)
    b = policy.generate(prompts, temperature=1.0, max_new_tokens=8, seed=5)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    g1 = policy.generate(prompts, temperature=0.0, max_new_tokens=8)
    g2 = policy.generate(list(reversed(prompts)), temperature=0.0, max_new_tokens=8)
    assert [g.token_ids for g in g1] == [g.token_ids for g in reversed(g2)]  # order is the caller's


def test_cut_at_stop_string_and_eos(base_model_dir):
    policy = tiny_policy(base_model_dir)
    tok = policy.tok
    ids = tok.encode("<think>a</think><action>look</action> and more text", add_special_tokens=False)
    g = policy.cut_at_stop(ids, [-1.0] * len(ids), ["</action>"])
    assert g.text == "<think>a</think><action>look</action>" and g.finished
    assert tok.decode(g.token_ids).endswith("</action>") and len(g.logprobs) == len(g.token_ids)
    g = policy.cut_at_stop(ids[:5] + [tok.eos_token_id, 7, 8], [-1.0] * 8, ["</action>"])
    assert g.token_ids == ids[:5] + [tok.eos_token_id] and g.finished
    g = policy.cut_at_stop(ids[:5], [-1.0] * 5, ["</action>"])
    assert not g.finished and g.token_ids == ids[:5]


def test_scoring_gradient_flows_only_through_response(base_model_dir):
    policy = tiny_policy(base_model_dir)
    prompt_ids = [policy.encoder.encode_prompt("hello there")]
    lp = policy.score(prompt_ids, [[5, 6, 7]])[0]
    assert lp.requires_grad and lp.shape == (3,)
    lp.sum().backward()
    assert policy.model.get_output_embeddings().weight.grad.abs().sum() > 0
