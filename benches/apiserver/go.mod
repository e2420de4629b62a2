module concord.local/apiserver-load

go 1.26.8
