"""What every wing that checks a build shares: the error measures (measures), a model's samples and
the CPU reference (modeldata), WAV files read without libsndfile (audio), a graph's declared
interface as JSON (iorecord). Imports only spec/, engine/ and errors."""
