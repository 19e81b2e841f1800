"""What SEED is: prompts, skills, teachers, re-scoring, advantages, losses, and the update that composes them."""
