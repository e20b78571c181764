"""Image and video input: decoding and checking data URLs, fetching allowed http(s) URLs."""
