"""Drafts of the Hopper attention kernels and the benchmarks that compared them with the shipped ones."""
