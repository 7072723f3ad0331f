"""Reading a MindSpore dump: find the first operator that turned finite inputs into Inf/NaN."""
