.PHONY: test

test:
	cargo test --all-targets
