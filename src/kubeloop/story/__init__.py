"""The loop told end to end: what `kubeloop demo` shows and the loop's
end-to-end test asserts, hop by hop, from the same code."""
