module kubeloop.dev/tools/pause

go 1.26.0
