"""What a sim step computes: batching, the prefix cache, the cost model, draft tiers, tokens, GPU mode."""
