"""From image to job: Vertex AI CustomJobs, Kubeflow manifests, and job specs run locally.

``python -m entrypoint job vertex|kubeflow ... -- RUN ARGS`` writes the job for one of our images;
``python -m entrypoint local --spec FILE`` runs such a job on this machine. Nothing here imports
google-cloud-aiplatform or a Kubernetes client: specs are plain dicts rendered as text.
"""
