"""The encoder a method trains: backbone loading, poolers and export (:mod:`.backbone`), the encoding
function (:mod:`.encoder`), padding-free forward (:mod:`.unpad`) and keyed dropout (:mod:`.dropout`)."""
