"""Operations on nodes: plain Python with no Pulumi import, shared by providers and the automation layer."""
