"""The ground floor beside formats/: errors, atomic output dirs, hashing, memory, text files. Imports
nothing of trtbuild above it."""
