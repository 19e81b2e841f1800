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


def test_a_groups_shared_prefix_runs_once_and_scores_the_same(base_model_dir):
    """Three groups share a prefix worth running once (one of them holds a prompt that is all prefix: one token of it
    stays with the row); one group's prefix is too short and a lone item has none: those go the ordinary way."""
    policy = tiny_policy(base_model_dir)
    a, b, d = list(range(100, 140)), list(range(300, 350)), list(range(500, 510))  # 40, 50 and 10 shared tokens
    prompts = [a + [1, 2, 3, 4, 5], a + [6] * 9, a + [7], b, b + [8, 9], [11, 12, 13], d + [14], d + [15, 16]]
    responses = [[20, 21, 22], [23] * 6, [24, 25], [26] * 4, [27], [28, 29], [30], [31, 32, 33]]
    groups = ["a", "a", "a", "b", "b", "c", "d", "d"]
    embedded = []
    hook = policy.model.get_input_embeddings().register_forward_hook(lambda m, i, o: embedded.append(i[0].numel()))
    with torch.no_grad():
        plain = policy.score(prompts, responses, max_tokens=10_000)
        n_plain = sum(embedded)
        embedded.clear()
        shared = policy.score(prompts, responses, max_tokens=10_000, groups=groups)
        hook.remove()
    trained = policy.score(prompts[:3], responses[:3], groups=groups[:3])  # grad on: every row runs whole
    assert all(lp.requires_grad for lp in trained)
    for want, got in zip(plain, shared):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert n_plain == 8 * 55  # one micro-batch of 8 rows, padded to the longest (49 prompt + 6 response tokens)
    # a: its 40-token prefix once, then 3 rows of tail + response padded to the longest (9 + 6);
    # b: 49 tokens once (the all-prefix prompt keeps its last one), 2 rows padded to 1 + 4;
    # c (alone) and d (10 shared tokens): one ordinary micro-batch of 3 rows padded to 12 + 3
    assert sum(embedded) == (40 + 3 * 15) + (49 + 2 * 5) + 3 * 15
    # one row per micro-batch: every micro-batch of a group continues the one prefix, run once per group
    embedded.clear()
    hook = policy.model.get_input_embeddings().register_forward_hook(lambda m, i, o: embedded.append(i[0].numel()))
    with torch.no_grad():
        one_by_one = policy.score(prompts, responses, max_tokens=1, groups=groups)
    hook.remove()
    for want, got in zip(plain, one_by_one):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert sum(embedded) == (40 + 3 + 8 + 15) + (49 + 4 + 5) + (5 + 12 + 15)  # rows unpadded, each alone
