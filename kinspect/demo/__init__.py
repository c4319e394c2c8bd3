"""`kinspect demo`: a Tansu broker, kinspect in rewrite mode in front of it, a sample workload and its summary."""
