"""Hot swap: a new checkpoint watched for, its generation built beside the serving one and switched to."""
