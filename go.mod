module github.com/godurable/godurable

go 1.26.8

require github.com/cenkalti/backoff/v4 v4.3.0

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
