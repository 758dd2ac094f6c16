"""Serverless prefill/decode provisioning (``kind: serverless``)."""
